//! Scale check (a benchmark, not a test): 100 McpServers with 10 McpTools each on a real
//! kube-apiserver. Measures the time from the last apply to every server Ready with every
//! tool rendered and every McpTool Accepted at its current generation, the API writes and
//! reads that took (by kind and verb), the Events published, the operator's CPU time and
//! RSS, and the largest ConfigMap against the API server's 1 MiB object limit. Then it
//! restarts the operator on the converged cluster and counts its API reads and writes
//! during the full resync (target: 0 of each).
//!
//!   cargo bench -p toolgate-operator --bench scale          (SCALE_SERVERS / SCALE_TOOLS override)
//!   SCALE_SERVERS=1000 cargo bench -p toolgate-operator --bench scale    (10,000 McpTools)
//!   SCALE_SERVERS=1 SCALE_TOOLS=1000 cargo bench -p toolgate-operator --bench scale

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Event};
use kube::api::ListParams;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use serde_json::json;
use toolgate_operator::crd::{HasConditions, McpServer, McpTool};

/// The API server refuses an object larger than this.
const OBJECT_LIMIT: usize = 1_048_576;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A watch-backed cache of `K` in `ns`: waiting on it costs the API server nothing.
fn cache<K>(c: &Client, ns: &str) -> Store<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(Api::<K>::namespaced(c.clone(), ns), Default::default()));
    tokio::spawn(stream.default_backoff().for_each(|_| async {}));
    store
}

/// Whether `condition` is True for the object's current generation.
fn holds(status: Option<&impl HasConditions>, condition: &str, generation: Option<i64>) -> bool {
    status
        .and_then(|s| s.condition(condition))
        .is_some_and(|c| c.status == "True" && c.observed_generation == generation)
}

/// Every server Ready with `tools` tools rendered, and every tool Accepted.
fn converged(servers: &Store<McpServer>, tools: &Store<McpTool>, want_servers: usize, want_tools: usize) -> bool {
    let rendered = format!("{} tools in ConfigMap", want_tools / want_servers.max(1));
    let servers = servers.state();
    let tools = tools.state();
    servers.len() == want_servers
        && tools.len() == want_tools
        && servers.iter().all(|s| {
            let st = s.status.as_ref();
            holds(st, "Ready", s.metadata.generation)
                && st
                    .and_then(|st| st.condition("ConfigRendered"))
                    .is_some_and(|c| c.message.starts_with(&rendered))
        })
        && tools
            .iter()
            .all(|t| holds(t.status.as_ref(), "Accepted", t.metadata.generation))
}

/// `name{labels}` series of `op`'s metrics, by their labels.
fn series(op: &Operator, name: &str) -> BTreeMap<String, f64> {
    op.metrics()
        .into_iter()
        .filter_map(|(k, v)| {
            let labels = k.strip_prefix(name)?;
            (labels.is_empty() || labels.starts_with('{')).then(|| (labels.to_string(), v))
        })
        .collect()
}

/// Mean reconcile time per controller, in ms.
fn mean_reconcile_ms(op: &Operator) -> String {
    let sums = series(op, "toolgate_operator_reconcile_duration_seconds_sum");
    let counts = series(op, "toolgate_operator_reconcile_duration_seconds_count");
    sums.iter()
        .map(|(l, s)| {
            format!(
                "{l} {:.1} ms",
                1000.0 * s / counts.get(l).copied().unwrap_or(1.0).max(1.0)
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// User plus system CPU time of process `pid`, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of stat(5); `rest` starts at field 3. Ticks are
    // USER_HZ, 100 on Linux.
    (ticks(11) + ticks(12)) / 100.0
}

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

fn show(map: &BTreeMap<String, f64>) -> String {
    map.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let (n_servers, n_tools) = (env("SCALE_SERVERS", 100), env("SCALE_TOOLS", 10));
    let c = client().await;
    let ns = namespace(&c, "scale").await;
    let servers = cache::<McpServer>(&c, &ns);
    let tools = cache::<McpTool>(&c, &ns);
    let op = Operator::start(&ns, "toolgate", &[]);

    let started = Instant::now();
    // In the order `kubectl apply -f dir/` would send them, 16 at a time.
    let mut objects = Vec::with_capacity(n_servers * (n_tools + 2));
    for s in 0..n_servers {
        let server_name = format!("srv-{s}");
        objects.push(deployment(&server_name));
        for t in 0..n_tools {
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
    let last_apply = Instant::now();
    let want_tools = n_servers * n_tools;
    eventually(
        "every server Ready and every tool Accepted",
        Duration::from_secs(900),
        || {
            let done = converged(&servers, &tools, n_servers, want_tools);
            async move { done.then_some(()) }
        },
    )
    .await;
    let after_last_apply = last_apply.elapsed();
    // Whatever is still in flight lands before counting.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let writes = series(&op, "toolgate_operator_api_writes_total");
    let reads = series(&op, "toolgate_operator_api_reads_total");
    let reconciles = series(&op, "toolgate_operator_reconciles_total");
    let reconcile_ms = mean_reconcile_ms(&op);
    let cpu = cpu_seconds(op.pid());
    let rss = rss_mib(op.pid());
    let cms = Api::<ConfigMap>::namespaced(c.clone(), &ns)
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=toolgate-operator"))
        .await
        .expect("ConfigMaps");
    let largest = cms
        .items
        .iter()
        .map(|cm| serde_json::to_vec(cm).map_or(0, |b| b.len()))
        .max()
        .unwrap_or(0);
    let mut events: BTreeMap<String, usize> = BTreeMap::new();
    for e in Api::<Event>::namespaced(c.clone(), &ns)
        .list(&ListParams::default())
        .await
        .expect("Events")
        .items
    {
        *events.entry(e.reason.unwrap_or_default()).or_default() += e.count.unwrap_or(1).max(1) as usize;
    }
    drop(op);

    // A full resync on the converged cluster: a fresh operator reconciles everything again.
    let op = Operator::start(&ns, "toolgate", &[]);
    eventually("the new operator leads", Duration::from_secs(30), || async {
        (op.metrics().get("toolgate_operator_leader").copied()? == 1.0).then_some(())
    })
    .await;
    let t = Instant::now();
    let target = n_servers as f64;
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
    // `+ 0.0`: a sum of no series is -0.
    let writes_resync = op.total("toolgate_operator_api_writes_total") + 0.0;
    let reads_resync = op.total("toolgate_operator_api_reads_total") + 0.0;

    let total = |m: &BTreeMap<String, f64>| m.values().sum::<f64>() + 0.0;
    println!("scale: {n_servers} McpServers x {n_tools} McpTools (+{n_servers} Deployments) on a real kube-apiserver");
    println!("  applied by the client in            {:>7.1} s", applied.as_secs_f64());
    println!(
        "  all Ready and Accepted, after the last apply {:>6.1} s ({} ConfigMaps)",
        after_last_apply.as_secs_f64(),
        cms.items.len()
    );
    println!(
        "  operator writes to converge         {:>7} ({})",
        total(&writes),
        show(&writes)
    );
    println!(
        "  operator reads to converge          {:>7} ({})",
        total(&reads),
        show(&reads)
    );
    println!(
        "  reconciles                          {:>7} ({})",
        total(&reconciles),
        show(&reconciles)
    );
    println!("  mean reconcile                      {reconcile_ms}");
    println!(
        "  Events                              {:>7} ({})",
        events.values().sum::<usize>(),
        events
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("  operator CPU to converge            {cpu:>7.1} s");
    println!("  operator RSS after converging       {rss:>7.1} MiB");
    println!(
        "  largest ConfigMap                   {largest:>7} bytes ({:.1}% of the {OBJECT_LIMIT}-byte object limit)",
        100.0 * largest as f64 / OBJECT_LIMIT as f64
    );
    println!(
        "  full resync after taking the lease  {:>7.1} s, API writes: {writes_resync}, reads: {reads_resync} (target 0 each), RSS {:.1} MiB",
        resync.as_secs_f64(),
        rss_mib(op.pid())
    );
    assert_eq!(
        (writes_resync, reads_resync),
        (0.0, 0.0),
        "a converged resync must write and read nothing: {:?}",
        op.metrics()
    );
}
