//! The operator keeps working across a kube-apiserver restart (its own control plane: the
//! restart would disturb the other tests).

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use serde_json::json;
use toolgate_operator::crd::McpTool;

#[tokio::test]
async fn the_operator_survives_a_kube_apiserver_restart() {
    let c = client().await;
    let ns = namespace(&c, "apiserver").await;
    let _: Deployment = apply(&c, &ns, deployment("shop")).await;
    let _: McpTool = apply(&c, &ns, tool("get-customer", "get_customer", json!({}))).await;
    apply_shop_server(&c, &ns).await;
    // The default 15 s lease outlives a restart of a few seconds; a shorter one would make
    // the leader step down (and exit), which is what it should do then.
    let op = Operator::start(&ns, "toolgate", &["--lease-duration-seconds", "15"]);
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), &ns);
    let has = |needle: &'static str| {
        let cms = cms.clone();
        move || {
            let cms = cms.clone();
            async move {
                let cm = cms.get_opt("shop-toolgate").await.ok()??;
                cm.data?
                    .get(toolgate_operator::render::CONFIG_KEY)?
                    .contains(needle)
                    .then_some(())
            }
        }
    };
    eventually("the first config", Duration::from_secs(30), has("get_customer")).await;

    restart_apiserver();

    let c = client().await;
    let _: McpTool = apply(
        &c,
        &ns,
        tool(
            "get-customer",
            "get_customer",
            json!({"description": "edited after the restart"}),
        ),
    )
    .await;
    let edited = tokio::time::timeout(Duration::from_secs(60), async {
        while has("edited after the restart")().await.is_none() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        edited.is_ok(),
        "the edit was not rendered after the restart; operator log:\n{}",
        op.logs()
    );
    assert!(
        op.metrics().contains_key("toolgate_operator_leader"),
        "the operator process is still up"
    );
    assert_eq!(
        op.metrics()["toolgate_operator_leader"],
        1.0,
        "and still leads:\n{}",
        op.logs()
    );
}
