//! The Helm chart with real tools: helm lint; helm template applied to a real kube-apiserver
//! (server-side dry run, then a real helm install); the operator run with the chart's
//! ServiceAccount token and the chart's arguments, reconciling a sample without one forbidden
//! request, and that ServiceAccount refused what it does not need. Also: every dashboard panel
//! and alert is valid PromQL over metrics the binaries export, and promtool's rule tests pass.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use serde_json::{json, Value};
use toolgate_operator::crd::{McpServer, McpTool};

const WAIT: Duration = Duration::from_secs(30);

fn tool_path(name: &str) -> PathBuf {
    let out = Command::new(repo().join("e2e/tools.sh"))
        .args(["path", name])
        .output()
        .expect("e2e/tools.sh");
    assert!(
        out.status.success(),
        "{name} is not built: run e2e/tools.sh build (test.sh does)"
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

fn chart() -> PathBuf {
    repo().join("charts/toolgate")
}

/// Runs `cmd`, returns stdout; panics with stderr on failure.
fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn kubectl(args: &[&str]) -> String {
    run(Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", &control_plane().kubeconfig))
}

fn helm(args: &[&str]) -> String {
    run(Command::new(tool_path("helm"))
        .args(args)
        .env("KUBECONFIG", &control_plane().kubeconfig)
        .env("HELM_CACHE_HOME", control_plane().dir.join("helm/cache"))
        .env("HELM_CONFIG_HOME", control_plane().dir.join("helm/config"))
        .env("HELM_DATA_HOME", control_plane().dir.join("helm/data")))
}

#[test]
fn the_chart_lints_and_its_crds_are_the_generated_ones() {
    let out = helm(&["lint", chart().to_str().unwrap(), "--strict"]);
    assert!(out.contains("0 chart(s) failed"), "{out}");
    let chart_crds = std::fs::read_to_string(chart().join("crds/toolgate.yaml")).unwrap();
    let crds = std::fs::read_to_string(repo().join("crds/toolgate.yaml")).unwrap();
    assert!(
        chart_crds == crds,
        "charts/toolgate/crds/toolgate.yaml differs from crds/: cp crds/toolgate.yaml charts/toolgate/crds/"
    );
    // A typo in values fails the install instead of being ignored.
    let bad = Command::new(tool_path("helm"))
        .args([
            "template",
            "t",
            chart().to_str().unwrap(),
            "--set",
            "operator.replica=3",
        ])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("replica"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}

#[test]
fn alert_rules_pass_their_promtool_tests() {
    let promtool = tool_path("promtool");
    let out = run(Command::new(&promtool)
        .current_dir(chart())
        .args(["test", "rules", "tests/alerts_test.yaml"]));
    assert!(out.contains("SUCCESS"), "{out}");
}

/// Every `toolgate_*`/`process_*` metric in `expr` (histogram suffixes removed).
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if (expr[i..].starts_with("toolgate_") || expr[i..].starts_with("process_"))
            && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_'))
        {
            let end = expr[i..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map_or(expr.len(), |e| i + e);
            let name = &expr[i..end];
            let base = ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            names.push(base.to_string());
            i = end;
        } else {
            i += 1;
        }
    }
    names
}

#[test]
fn every_dashboard_panel_and_alert_is_valid_promql_over_exported_metrics() {
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(chart().join("files/dashboard.json")).unwrap()).unwrap();
    let mut exprs = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "panel {} has no query", panel["title"]);
        for t in targets {
            exprs.push((
                panel["title"].as_str().unwrap().to_string(),
                t["expr"].as_str().unwrap().to_string(),
            ));
        }
    }
    for file in ["files/alerts-proxy.yaml", "files/alerts-operator.yaml"] {
        let alerts: Value = serde_saphyr::from_str(&std::fs::read_to_string(chart().join(file)).unwrap()).unwrap();
        for g in alerts["groups"].as_array().unwrap() {
            for r in g["rules"].as_array().unwrap() {
                let name = r["alert"].as_str().unwrap().to_string();
                exprs.push((name, r["expr"].as_str().unwrap().to_string()));
            }
        }
    }
    let mut exported = toolgate_proxy::metrics::METRICS.names();
    exported.extend(toolgate_operator::metrics::Metrics::new().names());
    for (title, expr) in &exprs {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "{title}: no Toolgate metric in {expr}");
        for n in names {
            assert!(
                exported.contains(&n),
                "{title}: `{n}` is not exported by toolgate-proxy or toolgate-operator"
            );
        }
    }
    // promtool parses each expression (as a recording rule; Grafana's variables substituted).
    let rules: Vec<Value> = exprs
        .iter()
        .enumerate()
        .map(|(i, (_, e))| json!({"record": format!("toolgate:check_{i}"), "expr": e.replace("$__rate_interval", "5m").replace("$namespace", ".*")}))
        .collect();
    let file = control_plane_free_dir().join("dashboard-rules.yaml");
    std::fs::write(
        &file,
        serde_saphyr::to_string(&json!({"groups": [{"name": "dashboard", "rules": rules}]})).unwrap(),
    )
    .unwrap();
    let out = run(Command::new(tool_path("promtool")).args(["check", "rules"]).arg(&file));
    assert!(out.contains(&format!("SUCCESS: {} rules found", exprs.len())), "{out}");
}

fn control_plane_free_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("toolgate-chart-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_installs_and_its_service_account_is_enough_and_no_more() {
    let c = client().await;
    let release_ns = namespace(&c, "toolgate-system").await;
    let rendered = helm(&[
        "template",
        "toolgate",
        chart().to_str().unwrap(),
        "--namespace",
        &release_ns,
    ]);
    let file = control_plane().dir.join("chart.yaml");
    std::fs::write(&file, &rendered).unwrap();
    let dry = kubectl(&[
        "apply",
        "--server-side",
        "--dry-run=server",
        "-n",
        &release_ns,
        "-f",
        file.to_str().unwrap(),
    ]);
    assert!(dry.contains("serverside-applied (server dry run)"), "{dry}");
    let out = helm(&[
        "install",
        "toolgate",
        chart().to_str().unwrap(),
        "--namespace",
        &release_ns,
        "--wait=false",
    ]);
    assert!(out.contains("STATUS: deployed"), "{out}");
    assert!(out.contains("Next steps"), "NOTES.txt: {out}");

    // The operator as the chart runs it: its Deployment's args, its ServiceAccount's token.
    let deployments: Api<Deployment> = Api::namespaced(c.clone(), &release_ns);
    let d = deployments
        .get("toolgate-operator")
        .await
        .expect("the chart's operator Deployment");
    let pod = d.spec.unwrap().template.spec.unwrap();
    let sa = pod.service_account_name.clone().unwrap();
    let container = &pod.containers[0];
    assert_eq!(
        container.security_context.as_ref().unwrap().read_only_root_filesystem,
        Some(true)
    );
    let args: Vec<String> = container
        .args
        .clone()
        .unwrap()
        .into_iter()
        .filter(|a| !a.starts_with("--admin-listen"))
        .collect();
    let token = kubectl(&["create", "token", &sa, "-n", &release_ns, "--duration=1h"]);
    let env: std::collections::HashMap<String, String> = std::fs::read_to_string(control_plane().dir.join("env"))
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
        .collect();
    let sa_kubeconfig = control_plane().dir.join("operator-sa.kubeconfig");
    std::fs::write(
        &sa_kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: cp\n  cluster: {{server: {}, certificate-authority: {}}}\nusers:\n- name: sa\n  user: {{token: {}}}\ncontexts:\n- name: sa\n  context: {{cluster: cp, user: sa}}\ncurrent-context: sa\n",
            env["APISERVER_URL"],
            env["APISERVER_CA"],
            token.trim()
        ),
    )
    .unwrap();
    let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let op = Operator::start_as(&sa_kubeconfig, &arg_refs);

    // A sample in another namespace, reconciled end to end with that identity.
    let ns = namespace(&c, "chart-sample").await;
    let _: Deployment = apply(&c, &ns, deployment("shop")).await;
    let original = template(&c, &ns, "shop").await;
    let _: McpTool = apply(&c, &ns, tool("get-customer", "get_customer", json!({}))).await;
    apply_shop_server(&c, &ns).await;
    let servers: Api<McpServer> = Api::namespaced(c.clone(), &ns);
    // The tool and the server arrive on separate watches, so the server's first reconcile may
    // run before the tool's event and honestly report Ready with no tools; the sample is done
    // once it is Ready with its one tool rendered.
    eventually("the sample Ready with its tool", WAIT, || async {
        let status = servers.get("shop").await.ok()?.status?;
        (status.tools == Some(1)
            && status
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True"))
        .then_some(())
    })
    .await;
    let cm = Api::<ConfigMap>::namespaced(c.clone(), &ns)
        .get("shop-toolgate")
        .await
        .unwrap();
    let text = cm.data.unwrap()[toolgate_operator::render::CONFIG_KEY].clone();
    assert!(text.contains("get_customer"));
    assert!(
        text.contains(r#""sessionKeyFile": "/etc/toolgate/secrets/session-keys/keys""#),
        "{text}"
    );
    // The session key, written with the chart's identity through its admission policy.
    let keys = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(c.clone(), &ns)
        .get("shop-session-keys")
        .await
        .unwrap();
    let line = String::from_utf8(keys.data.unwrap()["keys"].0.clone()).unwrap();
    use base64::Engine;
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(line.trim())
            .unwrap()
            .len(),
        32,
        "one random 32-byte key"
    );
    let t = template(&c, &ns, "shop").await;
    assert_eq!(
        t["spec"]["initContainers"][0]["image"], "toolgate/toolgate-proxy:0.1.0",
        "the chart's proxy image reaches the sidecar"
    );
    delete_and_wait_gone(&c, &ns, "shop").await;
    assert_eq!(template(&c, &ns, "shop").await, original);
    let logs = op.logs();
    // The API's refusal reads "... is forbidden: User ... (Forbidden)"; a bare "403" would also
    // match hex hashes in the log.
    for bad in ["forbidden", "Forbidden"] {
        assert!(
            !logs.contains(bad),
            "a request was refused to the chart's ServiceAccount:\n{logs}"
        );
    }
    assert_eq!(op.metrics()["toolgate_operator_leader"], 1.0);
    // promtool accepts a real scrape of the operator.
    let mut check = Command::new(tool_path("promtool"))
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut check.stdin.take().unwrap(), op.metrics_text().as_bytes()).unwrap();
    let out = check.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics (operator): {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // No broader than needed.
    let who = format!("system:serviceaccount:{release_ns}:{sa}");
    let can = |verb: &str, resource: &str, ns: &str| {
        let out = Command::new("kubectl")
            .args(["auth", "can-i", verb, resource, "-n", ns, "--as", &who])
            .env("KUBECONFIG", &control_plane().kubeconfig)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim() == "yes"
    };
    for (verb, resource) in [
        ("patch", "deployments"),
        ("watch", "mcptools.toolgate.dev"),
        ("patch", "mcpservers.toolgate.dev/status"),
        ("create", "configmaps"),
    ] {
        assert!(can(verb, resource, &ns), "the operator needs {verb} {resource}");
    }
    for (verb, resource) in [
        ("delete", "secrets"),
        ("patch", "secrets"),
        ("get", "pods"),
        ("create", "pods/exec"),
        ("delete", "mcpservers.toolgate.dev"),
        ("create", "mcptools.toolgate.dev"),
        ("update", "deployments"),
        ("create", "namespaces"),
        ("create", "clusterrolebindings"),
        ("create", "serviceaccounts/token"),
        ("patch", "nodes"),
        ("delete", "customresourcedefinitions"),
    ] {
        assert!(
            !can(verb, resource, &ns),
            "the operator must not be able to {verb} {resource}"
        );
    }
    // RBAC grants create and update on Secrets (a name that does not exist yet cannot be
    // granted); the chart's admission policy narrows them to the operator's own session keys.
    let as_operator = |verb: &str, manifest: &str| {
        let path = control_plane().dir.join(format!("secret-{verb}.yaml"));
        std::fs::write(&path, manifest).unwrap();
        Command::new("kubectl")
            .args([verb, "-f", path.to_str().unwrap(), "-n", &ns, "--as", &who])
            .env("KUBECONFIG", &control_plane().kubeconfig)
            .output()
            .unwrap()
    };
    let token_secret = "apiVersion: v1\nkind: Secret\nmetadata:\n  name: stolen-token\n  annotations: {kubernetes.io/service-account.name: default}\ntype: kubernetes.io/service-account-token\n";
    let plain_secret = "apiVersion: v1\nkind: Secret\nmetadata:\n  name: shop-session-keys\n  labels: {app.kubernetes.io/managed-by: toolgate-operator}\ntype: Opaque\nstringData: {keys: x}\n";
    for (what, manifest) in [
        ("a service-account token Secret", token_secret),
        ("a Secret no McpServer controls", plain_secret),
    ] {
        let out = as_operator("create", manifest);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("ValidatingAdmissionPolicy"),
            "the operator must not create {what}: {err}"
        );
    }
    // Nor may anyone else write a Secret that claims to be the operator's (it mounts a session
    // key only with that label, so a copied owner reference is not enough).
    let path = control_plane().dir.join("secret-impostor.yaml");
    std::fs::write(&path, plain_secret).unwrap();
    let out = Command::new("kubectl")
        .args(["create", "-f", path.to_str().unwrap(), "-n", &ns])
        .env("KUBECONFIG", &control_plane().kubeconfig)
        .output()
        .unwrap();
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("only toolgate-operator writes"),
        "an impostor key Secret: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    kubectl(&[
        "create",
        "secret",
        "generic",
        "users-secret",
        "-n",
        &ns,
        "--from-literal=k=v",
    ]);
    let takeover =
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: users-secret\ntype: Opaque\nstringData: {k: overwritten}\n";
    let out = as_operator("replace", takeover);
    assert!(!out.status.success(), "the operator must not overwrite a user's Secret");
    assert!(can("update", "leases.coordination.k8s.io", &release_ns));
    assert!(
        !can("update", "leases.coordination.k8s.io", &ns),
        "leases only in the release namespace"
    );
}
