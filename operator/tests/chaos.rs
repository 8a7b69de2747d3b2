//! Chaos: kube-apiserver and etcd restarted during a 100-server apply, the leader killed
//! mid-reconcile, and tools changed while it happens. Every server converges with exactly its
//! tools, no ConfigMap is ever written with fewer tools than its server had, and a restarted
//! operator (a full resync) then writes and reads nothing. Its own control plane: the
//! restarts would disturb the other tests.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{json, Value};
use toolgate_operator::crd::McpServer;

const SERVERS: usize = 100;
const TOOLS: usize = 3;
/// Servers that get a fourth tool and an edited one while the leader is being replaced.
const CHANGED: usize = 20;

/// Server-side apply that waits out an API server or etcd that is restarting.
async fn apply_through(c: &Client, ns: &str, object: &Value) {
    let kind = object["kind"].as_str().unwrap_or_default();
    let (group, version, plural) = match kind {
        "McpServer" => ("toolgate.dev", "v1alpha1", "mcpservers"),
        "McpTool" => ("toolgate.dev", "v1alpha1", "mcptools"),
        "Deployment" => ("apps", "v1", "deployments"),
        other => panic!("apply_through: {other}"),
    };
    let gvk = kube::api::GroupVersionKind::gvk(group, version, kind);
    let resource = kube::api::ApiResource::from_gvk_with_plural(&gvk, plural);
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(c.clone(), ns, &resource);
    let name = object["metadata"]["name"].as_str().expect("name");
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        match api
            .patch(name, &PatchParams::apply("kubectl-test").force(), &Patch::Apply(object))
            .await
        {
            Ok(_) => return,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("apply {kind} {name}: {e}"),
        }
    }
}

fn server_of(i: usize) -> Value {
    server(
        &format!("srv-{i}"),
        json!({"workloadRef": {"name": format!("app-{i}")}, "upstream": {"port": 8080}}),
    )
}

fn tool_of(i: usize, t: usize, description: &str) -> Value {
    tool(
        &format!("srv-{i}-tool-{t}"),
        &format!("tool_{t}"),
        json!({"serverRef": {"name": format!("srv-{i}")}, "description": description}),
    )
}

fn app_of(i: usize) -> Value {
    let mut d = deployment(&format!("app-{i}"));
    d["metadata"]["annotations"] = json!({"toolgate.dev/allow-mcp-server": format!("srv-{i}")});
    d
}

/// What `e2e/control-plane.sh <what>` does to the shared control plane.
fn control_plane_cmd(what: &str) {
    let status = std::process::Command::new(repo().join("e2e/control-plane.sh"))
        .arg(what)
        .arg(&control_plane().dir)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("run e2e/control-plane.sh");
    assert!(status.success(), "{what} failed");
}

fn leader(ops: &[&Operator]) -> Option<usize> {
    ops.iter()
        .position(|o| o.metrics().get("toolgate_operator_leader") == Some(&1.0))
}

#[tokio::test]
async fn servers_converge_through_restarts_and_a_leader_kill_and_no_config_ever_shrinks() {
    let c = client().await;
    let ns = namespace(&c, "chaos").await;
    let writes = ConfigWrites::watch(&c, &ns);
    // A lease that outlives a restart of a few seconds, so neither replica steps down then.
    let lease = ["--lease-duration-seconds", "10"];
    let mut a = Operator::start(&ns, "toolgate", &lease);
    let mut b = Operator::start(&ns, "toolgate", &lease);

    // The apply, in the order a chart or `kubectl apply -f dir/` would send it.
    let mut objects = Vec::new();
    for i in 0..SERVERS {
        objects.push(app_of(i));
        objects.extend((0..TOOLS).map(|t| tool_of(i, t, "as applied")));
        objects.push(server_of(i));
    }
    let total = objects.len();
    let done = Arc::new(AtomicUsize::new(0));
    let applier = {
        let (c, ns, done) = (c.clone(), ns.clone(), done.clone());
        tokio::spawn(async move {
            use futures::StreamExt;
            futures::stream::iter(objects)
                .for_each_concurrent(8, |o| {
                    let (c, ns, done) = (c.clone(), ns.clone(), done.clone());
                    async move {
                        apply_through(&c, &ns, &o).await;
                        done.fetch_add(1, Ordering::SeqCst);
                    }
                })
                .await;
        })
    };
    let reached = |share: usize| {
        let done = done.clone();
        move || {
            let done = done.clone();
            async move { (done.load(Ordering::SeqCst) * 4 >= total * share).then_some(()) }
        }
    };

    eventually("a quarter applied", Duration::from_secs(120), reached(1)).await;
    control_plane_cmd("restart-apiserver");
    eventually("half applied", Duration::from_secs(120), reached(2)).await;
    control_plane_cmd("restart-etcd");
    eventually("three quarters applied", Duration::from_secs(120), reached(3)).await;

    // The leader dies mid-reconcile; tools change while the standby takes over.
    let killed = eventually("a leader", Duration::from_secs(60), || async { leader(&[&a, &b]) }).await;
    let standby = if killed == 0 {
        a.stop_with("-KILL");
        &b
    } else {
        b.stop_with("-KILL");
        &a
    };
    applier.await.expect("the apply finished");
    for i in 0..CHANGED {
        apply_through(&c, &ns, &tool_of(i, 0, "edited during the takeover")).await;
        apply_through(&c, &ns, &tool_of(i, TOOLS, "added during the takeover")).await;
    }

    // Every server converges: Ready, with exactly its tools in its ConfigMap.
    let expected = |i: usize| if i < CHANGED { TOOLS + 1 } else { TOOLS };
    let servers: Api<McpServer> = Api::namespaced(c.clone(), &ns);
    let converged = tokio::time::timeout(Duration::from_secs(240), async {
        loop {
            let mut pending = Vec::new();
            for i in 0..SERVERS {
                let name = format!("srv-{i}");
                let ok = match servers.get_opt(&name).await {
                    Ok(Some(s)) => {
                        let v = serde_json::to_value(&s).unwrap_or_default();
                        condition(&v, "Ready").is_some_and(|(st, _, _)| st == "True")
                            && v["status"]["tools"] == json!(expected(i))
                            && v["status"]["observedGeneration"] == v["metadata"]["generation"]
                    }
                    _ => false,
                };
                if ok {
                    let text = config_of(&c, &ns, &name).await.unwrap_or_default();
                    if rendered_tools(&text) == expected(i)
                        && (i >= CHANGED || text.contains("edited during the takeover"))
                    {
                        continue;
                    }
                }
                pending.push(name);
            }
            if pending.is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await;
    assert!(
        converged.is_ok(),
        "not every server converged; the standby's log:\n{}",
        standby.logs()
    );

    // No ConfigMap was ever written with fewer tools than an earlier version had (tools were
    // only added), and each holds at least its server's applied tools.
    let mut last: BTreeMap<String, usize> = BTreeMap::new();
    for (name, n) in writes.seen() {
        let before = last.insert(name.clone(), n).unwrap_or(0);
        assert!(
            n >= before,
            "ConfigMap {name} shrank from {before} to {n} tools: {:?}",
            writes.seen()
        );
    }
    assert_eq!(last.len(), SERVERS, "a ConfigMap per server: {last:?}");
    eprintln!(
        "converged: {} ConfigMap versions seen for {SERVERS} servers; the standby sent {} writes and {} reads",
        writes.seen().len(),
        standby.total("toolgate_operator_api_writes_total"),
        standby.total("toolgate_operator_api_reads_total")
    );

    // A restarted operator on the converged namespace: a full resync from fresh watches.
    let standby_pid = standby.pid();
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &standby_pid.to_string()])
        .status();
    let third = Operator::start(&ns, "toolgate", &lease);
    eventually(
        "the third operator reconciled every server",
        Duration::from_secs(120),
        || async {
            let ok = third
                .metrics()
                .get("toolgate_operator_reconciles_total{controller=\"mcpserver\",result=\"ok\"}")
                .copied()?;
            (ok >= SERVERS as f64).then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let m = third.metrics();
    assert_eq!(
        third.total("toolgate_operator_api_writes_total"),
        0.0,
        "a converged resync writes nothing: {m:?}"
    );
    assert_eq!(
        third.total("toolgate_operator_api_reads_total"),
        0.0,
        "and reads nothing but its watches: {m:?}"
    );
    drop(writes);
}

async fn config_of(c: &Client, ns: &str, server: &str) -> Option<String> {
    let cm = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(c.clone(), ns)
        .get_opt(&format!("{server}-toolgate"))
        .await
        .ok()??;
    cm.data?.get(toolgate_operator::render::CONFIG_KEY).cloned()
}
