//! The operator against a real kube-apiserver + etcd (started by the harness): reconcile,
//! status, hot-reloadable tool edits and deletion (CEL rules are in `crds.rs`, restarts and
//! leader election in `lifecycle.rs`).

mod common;

use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Secret, Service};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use toolgate_operator::crd::{McpServer, McpTool};

fn tool_names(text: &str) -> Vec<String> {
    let cfg = toolgate_config::parse_text(text).expect("the proxy loads the rendered config");
    cfg.validate().expect("and it validates");
    cfg.tools.iter().map(|t| t.name.clone()).collect()
}

#[tokio::test]
async fn a_server_and_its_tools_become_config_sidecar_service_and_status_and_deletion_restores_the_deployment() {
    let c = client().await;
    let ns = namespace(&c, "reconcile").await;
    let _d: Deployment = apply(&c, &ns, deployment("shop")).await;
    let original = template(&c, &ns, "shop").await;
    let _: McpTool = apply(&c, &ns, tool("get-customer", "get_customer", json!({}))).await;
    let _: McpTool = apply(
        &c,
        &ns,
        tool(
            "bad-mapping",
            "get_order",
            json!({"http": {"method": "GET", "path": "/orders/{orderId}"}}),
        ),
    )
    .await;
    let _: McpTool = apply(
        &c,
        &ns,
        tool("create-ticket", "create_ticket", json!({"http": {"method": "POST", "path": "/tickets"}, "inputSchema": {"type": "object", "properties": {"subject": {"type": "string"}}}})),
    )
    .await;
    apply_shop_server(&c, &ns).await;
    let op = Operator::start(&ns, "toolgate", &[]);

    let ready = wait_condition(&c, &ns, "McpServer", "shop", "Ready", "True", "Ready").await;
    assert!(ready.contains("serving 1 tools"), "{ready}");
    let s = get_server(&c, &ns, "shop").await;
    assert_eq!(s["status"]["tools"], 1);
    assert_eq!(s["status"]["endpoint"], format!("http://shop-mcp.{ns}.svc:8931/mcp"));
    assert_eq!(s["status"]["observedGeneration"], s["metadata"]["generation"]);
    assert_eq!(condition(&s, "SidecarInjected").unwrap().0, "True");
    assert_eq!(condition(&s, "ConfigRendered").unwrap().0, "True");

    // The ConfigMap: exactly the accepted tool, hash annotation = status, owned by the server.
    let cm = Api::<ConfigMap>::namespaced(c.clone(), &ns)
        .get("shop-toolgate")
        .await
        .unwrap();
    assert_eq!(
        tool_names(&cm.data.as_ref().unwrap()[toolgate_operator::render::CONFIG_KEY]),
        ["get_customer"]
    );
    assert_eq!(
        cm.metadata.annotations.as_ref().unwrap()["toolgate.dev/config-hash"],
        s["status"]["configHash"].as_str().unwrap()
    );
    assert_eq!(cm.metadata.owner_references.as_ref().unwrap()[0].name, "shop");

    // Each tool says whether it is served, and why not.
    wait_condition(&c, &ns, "McpTool", "get-customer", "Accepted", "True", "Accepted").await;
    let m = wait_condition(&c, &ns, "McpTool", "bad-mapping", "Accepted", "False", "InvalidMapping").await;
    assert!(m.contains("orderId"), "{m}");
    let m = wait_condition(
        &c,
        &ns,
        "McpTool",
        "create-ticket",
        "Accepted",
        "False",
        "ReadOnlyServer",
    )
    .await;
    assert!(m.contains("readOnly: false"), "{m}");

    // The sidecar: a native sidecar with the config volume; the app container untouched.
    let t = template(&c, &ns, "shop").await;
    let init = &t["spec"]["initContainers"][0];
    assert_eq!(init["name"], "toolgate-proxy");
    assert_eq!(init["restartPolicy"], "Always");
    assert_eq!(t["spec"]["containers"], original["spec"]["containers"]);
    let vols: Vec<&str> = t["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        vols,
        ["data", "toolgate-config", "toolgate-no-token", "toolgate-session-keys"]
    );
    // The proxy container does not see the pod's ServiceAccount token.
    assert!(
        init["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["name"] == "toolgate-no-token"
                && m["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount"),
        "{init}"
    );

    // The Service selects the workload's pods.
    let svc = Api::<Service>::namespaced(c.clone(), &ns)
        .get("shop-mcp")
        .await
        .unwrap();
    let spec = svc.spec.unwrap();
    assert_eq!(spec.selector.unwrap()["app"], "shop");
    assert_eq!(spec.ports.unwrap()[0].port, 8931);

    // Events with specific reasons.
    let events = Api::<Event>::namespaced(c.clone(), &ns)
        .list(&ListParams::default())
        .await
        .unwrap();
    let reasons: Vec<String> = events.items.iter().filter_map(|e| e.reason.clone()).collect();
    for r in ["ConfigApplied", "SidecarApplied", "InvalidMapping", "ReadOnlyServer"] {
        assert!(reasons.iter().any(|x| x == r), "no {r} event in {reasons:?}");
    }

    // A tool edit reaches the ConfigMap and leaves the pod template alone (no rollout).
    let before = Api::<Deployment>::namespaced(c.clone(), &ns).get("shop").await.unwrap();
    let _: McpTool = apply(
        &c,
        &ns,
        tool(
            "get-customer",
            "get_customer",
            json!({"description": "Look up one customer by id"}),
        ),
    )
    .await;
    eventually("the edit in the ConfigMap", WAIT, || async {
        config_text(&c, &ns, "shop")
            .await
            .filter(|t| t.contains("Look up one customer by id"))
    })
    .await;
    // Serving write tools is config too: no rollout either.
    let _: McpServer = apply(
        &c,
        &ns,
        server(
            "shop",
            json!({"workloadRef": {"name": "shop"}, "upstream": {"port": 8080}, "readOnly": false}),
        ),
    )
    .await;
    wait_condition(&c, &ns, "McpTool", "create-ticket", "Accepted", "True", "Accepted").await;
    let text = config_text(&c, &ns, "shop").await.unwrap();
    assert_eq!(tool_names(&text), ["create_ticket", "get_customer"]);
    let after = Api::<Deployment>::namespaced(c.clone(), &ns).get("shop").await.unwrap();
    assert_eq!(
        after.metadata.generation, before.metadata.generation,
        "tool changes must not change the Deployment"
    );
    assert_eq!(after.spec.unwrap().template, before.spec.unwrap().template);

    // A second image is a restart-worthy change: the template changes.
    let _: McpServer = apply(
        &c,
        &ns,
        server("shop", json!({"workloadRef": {"name": "shop"}, "upstream": {"port": 8080}, "readOnly": false, "image": "toolgate/toolgate-proxy:next"})),
    )
    .await;
    eventually("the new image in the pod template", WAIT, || async {
        let t = template(&c, &ns, "shop").await;
        (t["spec"]["initContainers"][0]["image"] == "toolgate/toolgate-proxy:next").then_some(())
    })
    .await;

    // Deleting the server removes exactly what the operator added.
    delete_and_wait_gone(&c, &ns, "shop").await;
    let restored = Api::<Deployment>::namespaced(c.clone(), &ns).get("shop").await.unwrap();
    assert_eq!(serde_json::to_value(restored.spec.unwrap().template).unwrap(), original);
    let annotations = restored.metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations
            .keys()
            .filter(|k| k.starts_with("toolgate.dev/"))
            .collect::<Vec<_>>(),
        ["toolgate.dev/allow-mcp-server"],
        "only the owner's opt-in is left: {annotations:?}"
    );
    assert!(Api::<ConfigMap>::namespaced(c.clone(), &ns)
        .get_opt("shop-toolgate")
        .await
        .unwrap()
        .is_none());
    assert!(Api::<Service>::namespaced(c.clone(), &ns)
        .get_opt("shop-mcp")
        .await
        .unwrap()
        .is_none());
    // Its tools now point at nothing, and say so.
    wait_condition(
        &c,
        &ns,
        "McpTool",
        "get-customer",
        "Accepted",
        "False",
        "ServerNotFound",
    )
    .await;
    drop(op);
}

#[tokio::test]
async fn gateway_mode_runs_its_own_deployment_and_becomes_ready_when_available() {
    let c = client().await;
    let ns = namespace(&c, "gateway").await;
    let _: Service = apply(&c, &ns, upstream_service("shop-api", Some("shop"))).await;
    let _: McpTool = apply(&c, &ns, tool("get-customer", "get_customer", json!({}))).await;
    let _: McpServer = apply(
        &c,
        &ns,
        server(
            "shop",
            json!({"mode": "Gateway", "upstream": {"service": {"name": "shop-api", "port": 80}}, "replicas": 1}),
        ),
    )
    .await;
    let _op = Operator::start(&ns, "toolgate", &[]);
    let m = wait_condition(
        &c,
        &ns,
        "McpServer",
        "shop",
        "GatewayAvailable",
        "False",
        "GatewayProgressing",
    )
    .await;
    assert!(m.contains("0/1"), "{m}");
    let gw = Api::<Deployment>::namespaced(c.clone(), &ns)
        .get("shop-gateway")
        .await
        .unwrap();
    let pod = gw.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    assert_eq!(pod.containers[0].name, "toolgate-proxy");
    assert_eq!(pod.automount_service_account_token, Some(false));
    let svc = Api::<Service>::namespaced(c.clone(), &ns)
        .get("shop-mcp")
        .await
        .unwrap();
    assert_eq!(
        svc.spec.unwrap().selector.unwrap()["app.kubernetes.io/name"],
        "toolgate-gateway"
    );
    let text = config_text(&c, &ns, "shop").await.unwrap();
    assert!(
        text.contains(&format!(r#""baseUrl": "http://shop-api.{ns}.svc:80""#)),
        "{text}"
    );

    // Play the Deployment controller: one replica available.
    Api::<Deployment>::namespaced(c.clone(), &ns)
        .patch_status(
            "shop-gateway",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"replicas": 1, "readyReplicas": 1, "availableReplicas": 1}})),
        )
        .await
        .unwrap();
    wait_condition(&c, &ns, "McpServer", "shop", "Ready", "True", "Ready").await;
}

#[tokio::test]
async fn a_missing_or_unlabelled_secret_holds_the_sidecar_until_it_may_be_mounted_and_is_never_copied() {
    let c = client().await;
    let ns = namespace(&c, "secret").await;
    let _: Deployment = apply(&c, &ns, deployment("shop")).await;
    let _: McpTool = apply(&c, &ns, tool("get-customer", "get_customer", json!({}))).await;
    let spec = json!({"workloadRef": {"name": "shop"}, "upstream": {"port": 8080},
        "auth": {"mode": "apiKey", "credentialsSecretRef": {"name": "shop-keys", "key": "credentials.yaml"}}});
    let _: McpServer = apply(&c, &ns, server("shop", spec)).await;
    let _op = Operator::start(&ns, "toolgate", &[]);
    let m = wait_condition(
        &c,
        &ns,
        "McpServer",
        "shop",
        "SidecarInjected",
        "False",
        "SecretNotFound",
    )
    .await;
    assert!(m.contains("shop-keys"), "{m}");
    assert!(template(&c, &ns, "shop").await["spec"].get("initContainers").is_none());

    // The Secret exists but has not opted in: still nothing is mounted.
    let secret: Secret = serde_json::from_value(json!({"metadata": {"name": "shop-keys"},
        "stringData": {"credentials.yaml": "credentials:\n- id: agent\n  key: s3cr3t-value-never-copied\n  role: viewer\n"}})).unwrap();
    let secrets = Api::<Secret>::namespaced(c.clone(), &ns);
    secrets.create(&PostParams::default(), &secret).await.unwrap();
    let m = wait_condition(
        &c,
        &ns,
        "McpServer",
        "shop",
        "SidecarInjected",
        "False",
        "SecretNotAllowed",
    )
    .await;
    assert!(m.contains("toolgate.dev/usage=proxy"), "{m}");
    assert!(template(&c, &ns, "shop").await["spec"].get("initContainers").is_none());
    // Whoever may write the Secret labels it for the proxy.
    secrets
        .patch(
            "shop-keys",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"toolgate.dev/usage": "proxy"}}})),
        )
        .await
        .unwrap();
    wait_condition(&c, &ns, "McpServer", "shop", "Ready", "True", "Ready").await;
    let t = template(&c, &ns, "shop").await;
    let vol = t["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "toolgate-auth-credentials")
        .cloned()
        .unwrap();
    assert_eq!(vol["secret"]["secretName"], "shop-keys");
    let text = config_text(&c, &ns, "shop").await.unwrap();
    assert!(
        text.contains(r#""credentialsFile": "/etc/toolgate/secrets/auth-credentials/credentials.yaml""#),
        "{text}"
    );
    assert!(!text.contains("s3cr3t"), "a secret value reached the ConfigMap");
}

// Multi-threaded: the example service and the projection run while the client blocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_client_calls_tools_through_the_rendered_config_and_sees_edits_without_a_restart() {
    let c = client().await;
    let ns = namespace(&c, "e2e").await;
    let upstream = toolgate_example_service::spawn().await.expect("example service");
    // Held until the proxy listens on them, seconds from now.
    let ((mcp_port, mcp_held), (admin_port, admin_held)) = (held_port(), held_port());
    let _: Deployment = apply(&c, &ns, deployment("shop")).await;
    let _: McpTool = apply(
        &c,
        &ns,
        tool(
            "get-customer",
            "get_customer",
            json!({"response": {"pick": ["/id", "/name"]}}),
        ),
    )
    .await;
    // This test plays the kubelet for the ConfigMap only; mounting the session-key Secret is a
    // node's job, so the one proxy here keeps its sessions in memory.
    let spec = json!({"workloadRef": {"name": "shop"}, "upstream": {"port": upstream.port()}, "port": mcp_port, "adminPort": admin_port,
                      "sessions": {"sealed": false}});
    let _: McpServer = apply(&c, &ns, server("shop", spec)).await;
    let _op = Operator::start(&ns, "toolgate", &[]);
    wait_condition(&c, &ns, "McpServer", "shop", "Ready", "True", "Ready").await;

    // The kubelet's part: mount the ConfigMap, start the container with the args the operator
    // put in the pod template (the listen host moved to loopback: no pod network here).
    let t = template(&c, &ns, "shop").await;
    let init = &t["spec"]["initContainers"][0];
    let args: Vec<String> = serde_json::from_value(init["args"].clone()).unwrap();
    assert_eq!(args, ["--config", "/etc/toolgate/config/proxy.json"]);
    let mount = control_plane().dir.join(format!("{ns}-config"));
    let _projection = Projection::start(&c, &ns, "shop-toolgate", mount.clone()).await;
    let proxy_bin = std::path::Path::new(env!("CARGO_BIN_EXE_toolgate-operator")).with_file_name("toolgate-proxy");
    assert!(
        proxy_bin.exists(),
        "{} is missing: cargo build -p toolgate-proxy",
        proxy_bin.display()
    );
    let mut proxy = KillOnDrop(
        std::process::Command::new(&proxy_bin)
            .args([
                "--config",
                mount.join(toolgate_operator::render::CONFIG_KEY).to_str().unwrap(),
                "--bind-host",
                "127.0.0.1",
                "--reload-interval-ms",
                "200",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start toolgate-proxy"),
    );
    let admin: std::net::SocketAddr = format!("127.0.0.1:{admin_port}").parse().unwrap();
    // The proxy's own readiness (it names its config generation), not any server's 200.
    eventually("the proxy ready", WAIT, || async {
        http_get(admin, "/readyz").filter(|body| body.contains("\"generation\""))
    })
    .await;
    drop((mcp_held, admin_held));

    let url = format!("http://127.0.0.1:{mcp_port}/mcp");
    let first = mcp_client(&url, Some(("get_customer", json!({"id": "42"}))));
    assert_eq!(first["serverName"], "shop");
    assert_eq!(
        first["tools"].as_object().unwrap().keys().collect::<Vec<_>>(),
        ["get_customer"]
    );
    let env = &first["call"]["envelope"];
    assert_eq!(first["call"]["isError"], false, "{env}");
    assert_eq!(env["status"], "success");
    assert_eq!(env["data"]["id"], "42");
    assert_eq!(env["toolName"], "get_customer");

    // An McpTool edit and a new McpTool reach the running proxy by hot reload.
    let _: McpTool = apply(
        &c,
        &ns,
        tool(
            "get-customer",
            "get_customer",
            json!({"description": "Edited in the cluster", "response": {"pick": ["/id", "/name"]}}),
        ),
    )
    .await;
    let _: McpTool = apply(&c, &ns, tool("get-customer-v2", "get_customer_v2", json!({}))).await;
    let second = eventually("the edit served by the same proxy process", WAIT, || async {
        let out = mcp_client(&url, None);
        (out["tools"].as_object()?.len() == 2).then_some(out)
    })
    .await;
    assert!(
        second["tools"]["get_customer"]
            .as_str()
            .unwrap()
            .contains("Edited in the cluster"),
        "{second}"
    );
    assert!(
        proxy.0.try_wait().unwrap().is_none(),
        "the proxy must not have restarted"
    );
}

#[tokio::test]
async fn a_moved_tool_leaves_its_old_server_and_hand_edits_are_reverted() {
    let c = client().await;
    let ns = namespace(&c, "move").await;
    for d in ["shop", "billing"] {
        let _: Deployment = apply(&c, &ns, deployment(d)).await;
        let _: McpServer = apply(
            &c,
            &ns,
            server(d, json!({"workloadRef": {"name": d}, "upstream": {"port": 8080}})),
        )
        .await;
    }
    let _: McpTool = apply(&c, &ns, tool("lookup", "lookup", json!({}))).await;
    let _op = Operator::start(&ns, "toolgate", &[]);
    eventually("lookup served by shop", WAIT, || async {
        config_text(&c, &ns, "shop")
            .await
            .filter(|t| tool_names(t) == ["lookup"])
    })
    .await;

    let _: McpTool = apply(
        &c,
        &ns,
        tool("lookup", "lookup", json!({"serverRef": {"name": "billing"}})),
    )
    .await;
    eventually("lookup moved from shop to billing", WAIT, || async {
        let shop = config_text(&c, &ns, "shop").await?;
        let billing = config_text(&c, &ns, "billing").await?;
        (tool_names(&shop).is_empty() && tool_names(&billing) == ["lookup"]).then_some(())
    })
    .await;

    // Someone edits the rendered ConfigMap by hand: the operator puts it back.
    let cms = Api::<ConfigMap>::namespaced(c.clone(), &ns);
    cms.patch(
        "billing-toolgate",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {toolgate_operator::render::CONFIG_KEY: "hand edit"}})),
    )
    .await
    .unwrap();
    eventually("the hand edit reverted", WAIT, || async {
        config_text(&c, &ns, "billing")
            .await
            .filter(|t| rendered_tools(t) > 0 && tool_names(t).iter().any(|n| n.starts_with("lookup")))
    })
    .await;
}

#[tokio::test]
async fn foreign_objects_are_not_taken_over_and_a_co_owned_sidecar_is_still_removed() {
    let c = client().await;
    let ns = namespace(&c, "owners").await;
    let _: Deployment = apply(&c, &ns, deployment("shop")).await;
    let original = template(&c, &ns, "shop").await;
    // A Service with the name the operator would use, made by someone else.
    let svc: Service = serde_json::from_value(
        json!({"metadata": {"name": "shop-mcp"}, "spec": {"selector": {"app": "other"}, "ports": [{"port": 80}]}}),
    )
    .unwrap();
    Api::<Service>::namespaced(c.clone(), &ns)
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    let _: McpTool = apply(&c, &ns, tool("get-customer", "get_customer", json!({}))).await;
    apply_shop_server(&c, &ns).await;
    let _op = Operator::start(&ns, "toolgate", &[]);
    let m = wait_condition(&c, &ns, "McpServer", "shop", "Ready", "False", "ResourceConflict").await;
    assert!(m.contains("Service shop-mcp"), "{m}");
    let svc = Api::<Service>::namespaced(c.clone(), &ns)
        .get("shop-mcp")
        .await
        .unwrap();
    assert_eq!(
        svc.spec.unwrap().selector.unwrap()["app"],
        "other",
        "the foreign Service was changed"
    );

    // Another field manager takes over the sidecar's image (as `kubectl set image` would).
    eventually("the sidecar", WAIT, || async {
        template(&c, &ns, "shop").await["spec"]["initContainers"][0]["name"]
            .as_str()
            .map(|_| ())
    })
    .await;
    let takeover = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "shop"},
        "spec": {"template": {"spec": {"initContainers": [{"name": "toolgate-proxy", "image": "toolgate/toolgate-proxy:patched"}]}}}});
    Api::<Deployment>::namespaced(c.clone(), &ns)
        .patch(
            "shop",
            &PatchParams::apply("kubectl-set").force(),
            &Patch::Apply(&takeover),
        )
        .await
        .unwrap();
    delete_and_wait_gone(&c, &ns, "shop").await;
    assert_eq!(
        template(&c, &ns, "shop").await,
        original,
        "the Deployment is back to what its owner wrote"
    );
    assert!(
        Api::<Service>::namespaced(c.clone(), &ns)
            .get_opt("shop-mcp")
            .await
            .unwrap()
            .is_some(),
        "the foreign Service was deleted"
    );
}

/// A child process killed when the test ends, also when it fails.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn a_deployment_selecting_by_expressions_only_gets_its_sidecar_but_no_service_and_is_not_ready() {
    let c = client().await;
    let ns = namespace(&c, "selector").await;
    let mut d = deployment("shop");
    d["spec"]["selector"] = json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["shop"]}]});
    let _: Deployment = apply(&c, &ns, d).await;
    apply_shop_server(&c, &ns).await;
    let _op = Operator::start(&ns, "toolgate", &[]);
    let m = wait_condition(&c, &ns, "McpServer", "shop", "Ready", "False", "UnsupportedSelector").await;
    assert!(m.contains("matchLabels"), "{m}");
    let s = get_server(&c, &ns, "shop").await;
    assert_eq!(condition(&s, "SidecarInjected").unwrap().0, "True");
    assert!(Api::<Service>::namespaced(c.clone(), &ns)
        .get_opt("shop-mcp")
        .await
        .unwrap()
        .is_none());
}

/// Reasons of the Events in `ns`, by the name of the object they are about.
async fn event_reasons(c: &Client, ns: &str) -> Vec<(String, String)> {
    Api::<Event>::namespaced(c.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|e| (e.involved_object.name.unwrap_or_default(), e.reason.unwrap_or_default()))
        .collect()
}

#[tokio::test]
async fn a_tool_applied_before_its_server_waits_for_it_and_a_tool_without_one_says_so() {
    let c = client().await;
    let ns = namespace(&c, "order").await;
    let _op = Operator::start(&ns, "toolgate", &[]);
    let _: Deployment = apply(&c, &ns, deployment("shop")).await;
    // In the order `kubectl apply -f dir/` sends them: the tools first.
    let _: McpTool = apply(&c, &ns, tool("get-customer", "get_customer", json!({}))).await;
    let _: McpTool = apply(
        &c,
        &ns,
        tool("orphan", "orphan", json!({"serverRef": {"name": "nowhere"}})),
    )
    .await;
    apply_shop_server(&c, &ns).await;
    wait_condition(&c, &ns, "McpTool", "get-customer", "Accepted", "True", "Accepted").await;
    wait_condition(&c, &ns, "McpTool", "orphan", "Accepted", "False", "ServerNotFound").await;
    let reasons = eventually("the orphan's Event", WAIT, || async {
        let reasons = event_reasons(&c, &ns).await;
        reasons
            .contains(&("orphan".into(), "ServerNotFound".into()))
            .then_some(reasons)
    })
    .await;
    assert!(
        !reasons
            .iter()
            .any(|(o, r)| o == "get-customer" && r == "ServerNotFound"),
        "the tool's server came within the grace: {reasons:?}"
    );
    // A new server that works is not news condition by condition: what it did is.
    let server_reasons: Vec<&str> = reasons
        .iter()
        .filter(|(o, _)| o == "shop")
        .map(|(_, r)| r.as_str())
        .collect();
    for expected in ["ConfigApplied", "SidecarApplied"] {
        assert!(server_reasons.contains(&expected), "{server_reasons:?}");
    }
    // The condition SidecarInjected, True on first sight.
    assert!(!server_reasons.contains(&"SidecarInjected"), "{server_reasons:?}");

    // Pointed at a server that exists, the orphan is accepted.
    let _: McpTool = apply(&c, &ns, tool("orphan", "orphan", json!({}))).await;
    wait_condition(&c, &ns, "McpTool", "orphan", "Accepted", "True", "Accepted").await;
}
