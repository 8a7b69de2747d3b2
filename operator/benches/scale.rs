//! Scale check (a benchmark, not a test): 100 McpServers with 10 McpTools each on a real
//! kube-apiserver. Measures the time from apply to every ConfigMap rendered, then restarts
//! the operator on the converged cluster and counts its API reads and writes during the full
//! resync (target: 0 of each).
//!
//!   cargo bench -p toolgate-operator --bench scale          (SCALE_SERVERS / SCALE_TOOLS override)

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ListParams;
use kube::Api;
use serde_json::json;
use toolgate_operator::crd::McpServer;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let (servers, tools) = (env("SCALE_SERVERS", 100), env("SCALE_TOOLS", 10));
    let c = client().await;
    let ns = namespace(&c, "scale").await;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), &ns);
    let op = Operator::start(&ns, "toolgate", &[]);

    let started = Instant::now();
    // In the order `kubectl apply -f dir/` would send them, 16 at a time.
    let mut objects = Vec::with_capacity(servers * (tools + 2));
    for s in 0..servers {
        let server_name = format!("srv-{s}");
        objects.push(deployment(&server_name));
        for t in 0..tools {
            let mut doc = tool(&format!("srv-{s}-tool-{t}"), &format!("tool_{t}"), json!({}));
            doc["spec"]["serverRef"]["name"] = server_name.clone().into();
            objects.push(doc);
        }
        objects.push(server(
            &server_name,
            json!({"workloadRef": {"name": server_name}, "upstream": {"port": 8080}}),
        ));
    }
    apply_all(&c, &ns, objects, 16).await;
    let applied = started.elapsed();
    let want = format!("{tools} tools in ConfigMap");
    eventually("every server rendered", Duration::from_secs(600), || async {
        let list = Api::<McpServer>::namespaced(c.clone(), &ns)
            .list(&ListParams::default())
            .await
            .ok()?;
        let done = list
            .items
            .iter()
            .filter(|s| {
                s.status.as_ref().is_some_and(|st| {
                    st.conditions
                        .iter()
                        .any(|c| c.type_ == "ConfigRendered" && c.status == "True" && c.message.starts_with(&want))
                        && st.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                })
            })
            .count();
        (done == servers).then_some(())
    })
    .await;
    let rendered = started.elapsed();
    let n_cms = cms
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=toolgate-operator"))
        .await
        .unwrap()
        .items
        .len();
    let writes_first = op.total("toolgate_operator_api_writes_total") + 0.0;
    let reads_first = op.total("toolgate_operator_api_reads_total") + 0.0;
    let reconciles_first = op.total("toolgate_operator_reconciles_total") + 0.0;
    let rss_kib = rss(&op);
    drop(op);

    // A full resync on the converged cluster: a fresh operator reconciles everything again.
    let op = Operator::start(&ns, "toolgate", &[]);
    eventually("the new operator leads", Duration::from_secs(30), || async {
        (op.metrics().get("toolgate_operator_leader").copied()? == 1.0).then_some(())
    })
    .await;
    let t = Instant::now();
    let target = servers as f64;
    eventually(
        "the resync reconciled every server",
        Duration::from_secs(600),
        || async {
            (op.metrics()
                .get("toolgate_operator_reconciles_total{controller=\"mcpserver\",result=\"ok\"}")
                .copied()?
                >= target)
                .then_some(())
        },
    )
    .await;
    let resync = t.elapsed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let writes_resync = op.total("toolgate_operator_api_writes_total") + 0.0;
    let reads_resync = op.total("toolgate_operator_api_reads_total") + 0.0;
    let rss_resync = rss(&op);

    println!("scale: {servers} McpServers x {tools} McpTools (+{servers} Deployments) on a real kube-apiserver");
    println!("  applied by the client in        {:>8.1} s", applied.as_secs_f64());
    println!(
        "  all Ready with every tool, from the first apply: {:>6.1} s ({n_cms} ConfigMaps)",
        rendered.as_secs_f64()
    );
    println!(
        "  operator writes to converge     {writes_first:>8} ({reconciles_first} reconciles, {reads_first} reads)"
    );
    println!("  operator RSS after converging   {:>8.1} MiB", rss_kib as f64 / 1024.0);
    println!(
        "  full resync after taking the lease {:>5.1} s, API writes: {writes_resync}, reads: {reads_resync} (target 0 each), RSS {:.1} MiB",
        resync.as_secs_f64(),
        rss_resync as f64 / 1024.0
    );
    assert_eq!(
        (writes_resync, reads_resync),
        (0.0, 0.0),
        "a converged resync must write and read nothing: {:?}",
        op.metrics()
    );
}

fn rss(op: &Operator) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", op.pid())).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}
