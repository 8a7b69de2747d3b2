//! The operator's own lifecycle against a real kube-apiserver + etcd: a restarted operator
//! never writes a partial config and, once converged, writes nothing; two replicas elect one
//! leader and the standby takes over.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::DeleteParams;
use kube::{Api, Client};
use serde_json::json;
use toolgate_operator::crd::{McpServer, McpTool};

/// The McpTool list of a namespace with this many tools takes three pages, so a restarted
/// operator that reconciled before its caches were complete would render a part of them.
const MANY: usize = 1200;

/// Whether the ConfigMap of `shop` holds `n` tools within 120 s.
async fn wait_rendered(c: &Client, ns: &str, n: usize) -> bool {
    tokio::time::timeout(Duration::from_secs(120), async {
        while config_text(c, ns, "shop").await.map(|t| rendered_tools(&t)) != Some(n) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .is_ok()
}

#[tokio::test]
async fn a_restarted_operator_never_writes_a_partial_config() {
    let c = client().await;
    let ns = namespace(&c, "partial").await;
    let _: Deployment = apply(&c, &ns, deployment("shop")).await;
    apply_shop_server(&c, &ns).await;
    let tools = (0..MANY)
        .map(|i| tool(&format!("tool-{i}"), &format!("tool_{i}"), json!({})))
        .collect();
    apply_all(&c, &ns, tools, 16).await;
    let mut first = Operator::start(&ns, "toolgate", &[]);
    assert!(
        wait_rendered(&c, &ns, MANY).await,
        "not every tool was rendered; metrics {}\nlog:\n{}",
        first.metrics_text(),
        first.logs()
    );
    first.stop_with("-KILL");

    // One more tool while no operator runs: the next one must write, and must write them all.
    let writes = ConfigWrites::watch(&c, &ns);
    let _: McpTool = apply(&c, &ns, tool("tool-new", "tool_new", json!({}))).await;
    let second = Operator::start(&ns, "toolgate", &[]);
    assert!(
        wait_rendered(&c, &ns, MANY + 1).await,
        "the new tool was not rendered; ConfigMap versions {:?}; metrics {}\nlog:\n{}",
        writes.seen(),
        second.metrics_text(),
        second.logs()
    );
    let seen = writes.seen();
    assert!(
        seen.iter().all(|(_, n)| *n >= MANY),
        "a ConfigMap was written with fewer tools than exist: {seen:?}\n{}",
        second.logs()
    );
    // The write is counted when its answer is back, which can be after the test sees the
    // ConfigMap: wait for the count, then check it is one.
    let writes_total = || {
        second
            .metrics()
            .get("toolgate_operator_api_writes_total{kind=\"ConfigMap\",verb=\"apply\"}")
            .copied()
    };
    eventually("the ConfigMap write counted", Duration::from_secs(30), || async {
        writes_total().filter(|n| *n >= 1.0).map(|_| ())
    })
    .await;
    assert_eq!(
        writes_total(),
        Some(1.0),
        "one write of the ConfigMap: {:?}",
        second.metrics()
    );
}

#[tokio::test]
async fn a_restarted_operator_converges_and_then_writes_nothing() {
    let c = client().await;
    let ns = namespace(&c, "restart").await;
    let _: Deployment = apply(&c, &ns, deployment("shop")).await;
    for i in 0..5 {
        let _: McpTool = apply(&c, &ns, tool(&format!("tool-{i}"), &format!("tool_{i}"), json!({}))).await;
    }
    // Resources not in the API server's canonical form (it stores `0.5` as `500m`): a converged
    // resync still finds the sidecar unchanged.
    let spec = json!({
        "workloadRef": {"name": "shop"},
        "upstream": {"port": 8080},
        "resources": {"requests": {"cpu": "0.5", "memory": "0.03125Gi"}, "limits": {"memory": "134217728"}}
    });
    let _: McpServer = apply(&c, &ns, server("shop", spec)).await;
    let mut first = Operator::start(&ns, "toolgate", &[]);
    eventually("a first ConfigMap", WAIT, || async {
        config_text(&c, &ns, "shop").await
    })
    .await;
    first.stop_with("-KILL");

    // Changes while no operator runs.
    let _: McpTool = apply(
        &c,
        &ns,
        tool("tool-0", "tool_0", json!({"description": "changed while down"})),
    )
    .await;
    Api::<McpTool>::namespaced(c.clone(), &ns)
        .delete("tool-4", &DeleteParams::default())
        .await
        .unwrap();

    let second = Operator::start(&ns, "toolgate", &["--lease-duration-seconds", "3"]);
    eventually("the changes rendered", WAIT, || async {
        let t = config_text(&c, &ns, "shop").await?;
        (t.contains("changed while down") && !t.contains("tool_4")).then_some(())
    })
    .await;
    wait_condition(&c, &ns, "McpServer", "shop", "Ready", "True", "Ready").await;
    for i in 0..4 {
        let name = format!("tool-{i}");
        wait_condition(&c, &ns, "McpTool", &name, "Accepted", "True", "Accepted").await;
        eventually("the tool's status describes its generation", WAIT, || async {
            let t = get_tool(&c, &ns, &name).await;
            (t["status"]["observedGeneration"] == t["metadata"]["generation"]).then_some(())
        })
        .await;
    }
    // What the second operator did last, for the message should the third still find work.
    let second_logs = second.logs();
    drop(second);

    // A third start on a converged namespace: every reconcile is a no-op.
    let third = Operator::start(&ns, "toolgate", &["--lease-duration-seconds", "3"]);
    eventually("the third operator reconciled the server", WAIT, || async {
        (third
            .metrics()
            .get("toolgate_operator_reconciles_total{controller=\"mcpserver\",result=\"ok\"}")
            .copied()?
            >= 1.0)
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let writes = third.total("toolgate_operator_api_writes_total");
    assert_eq!(
        writes,
        0.0,
        "a converged resync must write nothing: {:?}\nthe third operator's log:\n{}\nthe second's:\n{}",
        third.metrics(),
        third.logs(),
        second_logs
    );
    // Every reconcile read the watch caches: not one object was read on its own.
    let reads = third.total("toolgate_operator_api_reads_total");
    assert_eq!(
        reads,
        0.0,
        "a converged resync must read nothing but its watches: {:?}",
        third.metrics()
    );
}

#[tokio::test]
async fn two_replicas_elect_one_leader_and_the_standby_takes_over() {
    let c = client().await;
    let ns = namespace(&c, "leader").await;
    let _: Deployment = apply(&c, &ns, deployment("shop")).await;
    let _: McpTool = apply(&c, &ns, tool("get-customer", "get_customer", json!({}))).await;
    apply_shop_server(&c, &ns).await;
    let args = ["--lease-duration-seconds", "3"];
    let mut a = Operator::start(&ns, "toolgate", &args);
    let b = Operator::start(&ns, "toolgate", &args);
    let leader = |o: &Operator| o.metrics().get("toolgate_operator_leader").copied();
    eventually("exactly one leader", WAIT, || async {
        match (leader(&a), leader(&b)) {
            (Some(x), Some(y)) if x + y == 1.0 => Some(()),
            _ => None,
        }
    })
    .await;
    wait_condition(&c, &ns, "McpServer", "shop", "Ready", "True", "Ready").await;
    let (mut gone, standby) = if leader(&a) == Some(1.0) { (a, b) } else { (b, a) };
    assert_eq!(
        standby.total("toolgate_operator_reconciles_total"),
        0.0,
        "the standby must not reconcile"
    );
    gone.stop_with("-KILL");
    eventually("the standby leads", WAIT, || async {
        (leader(&standby) == Some(1.0)).then_some(())
    })
    .await;
    let _: McpTool = apply(
        &c,
        &ns,
        tool("get-customer", "get_customer", json!({"description": "after failover"})),
    )
    .await;
    eventually("the new leader renders the edit", WAIT, || async {
        config_text(&c, &ns, "shop")
            .await
            .filter(|t| t.contains("after failover"))
    })
    .await;
    a = standby;
    drop(a);
}
