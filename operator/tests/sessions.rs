//! Sessions and shared limits of an McpServer on a real kube-apiserver: the operator keeps the
//! session key in a Secret it owns (never in the ConfigMap), every replica of a gateway mounts
//! it, a raised `keyGeneration` rotates it in steps, and `rateLimit.store.redis` renders the
//! shared store with its password mounted by reference.

mod common;

use base64::Engine;
use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use toolgate_operator::crd::{McpServer, McpTool};

async fn keys(c: &Client, ns: &str) -> Option<(Vec<String>, String)> {
    let s = Api::<Secret>::namespaced(c.clone(), ns)
        .get_opt("shop-session-keys")
        .await
        .ok()??;
    let text = String::from_utf8(s.data?.get("keys")?.0.clone()).ok()?;
    let phase = s.metadata.annotations?.get("toolgate.dev/session-key-phase")?.clone();
    Some((text.lines().map(str::to_string).collect(), phase))
}

#[tokio::test]
async fn the_session_key_lives_in_an_owned_secret_every_gateway_replica_mounts_and_rotates_in_steps() {
    let c = client().await;
    let ns = namespace(&c, "sessions").await;
    let _: Service = apply(&c, &ns, upstream_service("shop-api", Some("shop"))).await;
    let _: McpTool = apply(&c, &ns, tool("get-customer", "get_customer", json!({}))).await;
    let mut redis_password = Secret::default();
    redis_password.metadata.name = Some("shop-redis".into());
    redis_password.metadata.labels = Some([("toolgate.dev/usage".to_string(), "proxy".to_string())].into());
    redis_password.string_data = Some([("password".to_string(), "redis-s3cret-pw".to_string())].into());
    Api::<Secret>::namespaced(c.clone(), &ns)
        .create(&PostParams::default(), &redis_password)
        .await
        .unwrap();
    let _: McpServer = apply(
        &c,
        &ns,
        server(
            "shop",
            json!({"mode": "Gateway", "upstream": {"service": {"name": "shop-api", "port": 80}}, "replicas": 3,
                   "sessions": {"ttlSeconds": 600},
                   "rateLimit": {"store": {"redis": {"url": "redis://redis.shared.svc:6379/3",
                                                      "passwordSecretRef": {"name": "shop-redis", "key": "password"}}}}}),
        ),
    )
    .await;
    let _op = Operator::start(&ns, "toolgate", &["--session-key-propagation-seconds", "2"]);

    let (first, phase) = eventually("the session key Secret", WAIT, || keys(&c, &ns)).await;
    assert_eq!((first.len(), phase.as_str()), (1, "stable"));
    let raw = base64::engine::general_purpose::STANDARD.decode(&first[0]).unwrap();
    assert_eq!(raw.len(), 32);
    let secret = Api::<Secret>::namespaced(c.clone(), &ns)
        .get("shop-session-keys")
        .await
        .unwrap();
    assert_eq!(secret.metadata.owner_references.unwrap()[0].kind, "McpServer");
    assert_eq!(secret.type_.as_deref(), Some("Opaque"));

    // The ConfigMap names files only: no key, no password.
    let text = eventually("the config", WAIT, || async {
        Api::<ConfigMap>::namespaced(c.clone(), &ns)
            .get_opt("shop-toolgate")
            .await
            .ok()??
            .data?
            .remove(toolgate_operator::render::CONFIG_KEY)
    })
    .await;
    for want in [
        r#""sessionKeyFile": "/etc/toolgate/secrets/session-keys/keys""#,
        r#""sessionTtlSeconds": 600"#,
        r#""url": "redis://redis.shared.svc:6379/3""#,
        r#""passwordFile": "/etc/toolgate/secrets/store-password/password""#,
        &format!(r#""keyPrefix": "toolgate:{ns}:shop:""#),
    ] {
        assert!(text.contains(want), "{want} in\n{text}");
    }
    assert!(
        !text.contains(&first[0]) && !text.contains("redis-s3cret-pw"),
        "no secret in the ConfigMap"
    );
    toolgate_config::parse_text(&text).expect("the proxy loads it");

    // Every replica of the gateway mounts the same Secret.
    let gw = eventually("the gateway", WAIT, || async {
        Api::<Deployment>::namespaced(c.clone(), &ns)
            .get_opt("shop-gateway")
            .await
            .ok()?
    })
    .await;
    let spec = gw.spec.unwrap();
    assert_eq!(spec.replicas, Some(3));
    let pod = spec.template.spec.unwrap();
    let volumes: Vec<String> = pod
        .volumes
        .unwrap()
        .iter()
        .filter_map(|v| v.secret.as_ref().and_then(|s| s.secret_name.clone()))
        .collect();
    assert!(
        volumes.contains(&"shop-session-keys".to_string()) && volumes.contains(&"shop-redis".to_string()),
        "{volumes:?}"
    );

    // Rotation: staged (old first, new accepted), then active (new first, old accepted).
    Api::<McpServer>::namespaced(c.clone(), &ns)
        .patch(
            "shop",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"sessions": {"keyGeneration": 2}}})),
        )
        .await
        .unwrap();
    let (staged, _) = eventually("the new key staged", WAIT, || async {
        keys(&c, &ns).await.filter(|(_, p)| p == "staged")
    })
    .await;
    assert_eq!(staged.len(), 2);
    assert_eq!(
        staged[0], first[0],
        "the old key still seals while the new one propagates"
    );
    let (active, _) = eventually("the new key sealing", WAIT, || async {
        keys(&c, &ns).await.filter(|(_, p)| p == "active")
    })
    .await;
    assert_eq!(
        active,
        vec![staged[1].clone(), first[0].clone()],
        "the old key still opens its sessions"
    );

    // Deleting the Secret makes a new key (a server always has one).
    Api::<Secret>::namespaced(c.clone(), &ns)
        .delete("shop-session-keys", &Default::default())
        .await
        .unwrap();
    let (fresh, _) = eventually("a new key after deletion", WAIT, || async {
        keys(&c, &ns)
            .await
            .filter(|(k, _)| k.len() == 1 && k[0] != active[0] && k[0] != active[1])
    })
    .await;
    assert_eq!(fresh.len(), 1);
}

#[tokio::test]
async fn a_foreign_secret_of_the_key_name_is_never_taken_over_even_with_a_copied_owner_reference() {
    let c = client().await;
    let ns = namespace(&c, "sessions-foreign").await;
    let _: Service = apply(&c, &ns, upstream_service("shop-api", Some("shop"))).await;
    let server: McpServer = apply(
        &c,
        &ns,
        server(
            "shop",
            json!({"mode": "Gateway", "upstream": {"service": {"name": "shop-api", "port": 80}}}),
        ),
    )
    .await;
    // A namespace user plants a key in the operator's format, owned (on paper) by the server,
    // but without the operator's label.
    let planted = toolgate_operator::sessionkeys::Keys::fresh(1, 0);
    let foreign: Secret = serde_json::from_value(json!({
        "metadata": {
            "name": "shop-session-keys",
            "annotations": planted.annotations(),
            "ownerReferences": [{"apiVersion": "toolgate.dev/v1alpha1", "kind": "McpServer", "name": "shop",
                                 "uid": server.metadata.uid.clone().unwrap(), "controller": true}],
        },
        "stringData": {"keys": planted.text()},
    }))
    .unwrap();
    Api::<Secret>::namespaced(c.clone(), &ns)
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    let _op = Operator::start(&ns, "toolgate", &[]);
    let m = wait_condition(
        &c,
        &ns,
        "McpServer",
        "shop",
        "GatewayAvailable",
        "False",
        "ResourceConflict",
    )
    .await;
    assert!(m.contains("shop-session-keys"), "{m}");
    let s = Api::<Secret>::namespaced(c.clone(), &ns)
        .get("shop-session-keys")
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8(s.data.unwrap()["keys"].0.clone()).unwrap(),
        planted.text(),
        "left alone"
    );
    assert!(
        Api::<Deployment>::namespaced(c.clone(), &ns)
            .get_opt("shop-gateway")
            .await
            .unwrap()
            .is_none(),
        "no gateway mounts a key the operator did not make"
    );
}

#[tokio::test]
async fn cel_refuses_a_redis_url_with_a_password_and_out_of_range_settings() {
    let c = client().await;
    let ns = namespace(&c, "sessions-cel").await;
    let api: Api<McpServer> = Api::namespaced(c.clone(), &ns);
    for (spec, want) in [
        (
            json!({"rateLimit": {"store": {"redis": {"url": "redis://default:pw@redis:6379"}}}}),
            "without user info",
        ),
        (
            json!({"rateLimit": {"store": {"redis": {"url": "http://redis"}}}}),
            "redis.url must be",
        ),
        (
            json!({"rateLimit": {"store": {"redis": {"url": "rediss://redis:6380/#insecure"}}}}),
            "without a #fragment",
        ),
        (
            json!({"rateLimit": {"store": {"redis": {"url": "redis://r", "timeoutMs": 5000}}}}),
            "timeoutMs must be 1-1000",
        ),
        (json!({"sessions": {"ttlSeconds": 5}}), "ttlSeconds must be 60-604800"),
        (
            json!({"sessions": {"keyGeneration": 0}}),
            "keyGeneration must be at least 1",
        ),
    ] {
        let mut s = server(
            "shop",
            json!({"mode": "Gateway", "upstream": {"service": {"name": "shop-api", "port": 80}}}),
        );
        for (k, v) in spec.as_object().unwrap() {
            s["spec"][k] = v.clone();
        }
        let obj: McpServer = serde_json::from_value(s).unwrap();
        let err = api.create(&PostParams::default(), &obj).await.unwrap_err().to_string();
        assert!(err.contains(want), "{spec}: {err}");
    }
}
