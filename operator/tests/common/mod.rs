//! Harness for tests against a real kube-apiserver + etcd (e2e/control-plane.sh): one
//! control plane per test binary, a fresh namespace per test, the operator as a real process.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use serde_json::{json, Value};
use toolgate_operator::crd::{McpServer, McpTool};

mod operator;
// Not every test binary uses both.
#[allow(unused_imports)]
pub use operator::{held_port, Operator};

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repo root")
        .to_path_buf()
}

/// A running control plane, stopped by the script's watchdog when this process exits.
pub struct ControlPlane {
    pub dir: PathBuf,
    pub kubeconfig: PathBuf,
}

static CONTROL_PLANE: OnceLock<ControlPlane> = OnceLock::new();

/// Starts (once per test binary) a control plane and installs the CRDs from `crds/`.
pub fn control_plane() -> &'static ControlPlane {
    CONTROL_PLANE.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("toolgate-cp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let status = Command::new(repo().join("e2e/control-plane.sh"))
            .arg("start")
            .arg(&dir)
            .env("CONTROL_PLANE_STOP_WITH_PID", std::process::id().to_string())
            .env("CONTROL_PLANE_REMOVE_DIR", "1")
            .stdout(Stdio::null())
            .status()
            .expect("run e2e/control-plane.sh");
        assert!(
            status.success(),
            "e2e/control-plane.sh start failed (see its output above)"
        );
        let cp = ControlPlane {
            kubeconfig: dir.join("kubeconfig"),
            dir,
        };
        let kubeconfig = cp.kubeconfig.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("rt");
            rt.block_on(install_crds(&kubeconfig));
        })
        .join()
        .expect("CRDs installed");
        cp
    })
}

async fn install_crds(kubeconfig: &Path) {
    let client = client_for(kubeconfig).await;
    let api: Api<CustomResourceDefinition> = Api::all(client);
    let text = std::fs::read_to_string(repo().join("crds/toolgate.yaml")).expect("crds/toolgate.yaml");
    let mut names = Vec::new();
    for crd in serde_saphyr::from_multiple::<Value>(&text).expect("yaml") {
        if crd.is_null() {
            continue;
        }
        let name = crd["metadata"]["name"].as_str().expect("name").to_string();
        api.patch(
            &name,
            &PatchParams::apply("toolgate-tests").force(),
            &Patch::Apply(&crd),
        )
        .await
        .unwrap_or_else(|e| panic!("the apiserver refused CRD {name}: {e}"));
        names.push(name);
    }
    for name in names {
        eventually(&format!("CRD {name} established"), Duration::from_secs(20), || {
            let api = api.clone();
            let name = name.clone();
            async move {
                let crd = api.get(&name).await.ok()?;
                let established = crd
                    .status?
                    .conditions?
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True");
                established.then_some(())
            }
        })
        .await;
    }
}

async fn client_for(kubeconfig: &Path) -> Client {
    let kc = Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let cfg = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("config");
    Client::try_from(cfg).expect("client")
}

/// A client of the shared control plane acting as user `user` (the admin impersonates it), so
/// a test sees exactly what that user's RBAC rights allow.
pub async fn client_as(user: &str) -> Client {
    let kc = Kubeconfig::read_from(&control_plane().kubeconfig).expect("kubeconfig");
    let mut cfg = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("config");
    cfg.auth_info.impersonate = Some(user.to_string());
    Client::try_from(cfg).expect("client")
}

/// An admin client of the shared control plane.
pub async fn client() -> Client {
    client_for(&control_plane().kubeconfig).await
}

/// A fresh namespace `<prefix>-<n>`.
pub async fn namespace(client: &Client, prefix: &str) -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_micros();
    let name = format!("{prefix}-{n}");
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("namespace");
    name
}

/// Polls `f` every 100 ms until it returns Some, or panics naming `what`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Server-side applies `object` (JSON with apiVersion/kind/metadata) as the test's manager.
pub async fn apply<K>(client: &Client, ns: &str, object: Value) -> K
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let name = object["metadata"]["name"].as_str().expect("name").to_string();
    Api::<K>::namespaced(client.clone(), ns)
        .patch(
            &name,
            &PatchParams::apply("kubectl-test").force(),
            &Patch::Apply(&object),
        )
        .await
        .unwrap_or_else(|e| panic!("apply {name}: {e}"))
}

/// A Deployment `name` (label app=name) as a platform team would have it, opted in to the
/// sidecar of the McpServer of the same name.
pub fn deployment(name: &str) -> Value {
    let mut d = plain_deployment(name);
    d["metadata"]["annotations"] = json!({"toolgate.dev/allow-mcp-server": name});
    d
}

/// A Service `name` (port 80 to the pods labelled app=name) whose owner agreed to be fronted
/// by McpServer `server`'s gateway (`None`: not opted in).
pub fn upstream_service(name: &str, server: Option<&str>) -> Value {
    let mut svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
        "spec": {"selector": {"app": name}, "ports": [{"port": 80, "targetPort": 8080}]}});
    if let Some(s) = server {
        svc["metadata"]["annotations"] = json!({"toolgate.dev/allow-mcp-server": s});
    }
    svc
}

/// A Deployment `name` that has not opted in to any sidecar.
pub fn plain_deployment(name: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [{"name": "app", "image": "example/shop:1", "ports": [{"containerPort": 8080}]}],
                    "volumes": [{"name": "data", "emptyDir": {}}]
                }
            }
        }
    })
}

/// The McpServer `shop`: a sidecar in Deployment `shop`, upstream port 8080, defaults otherwise.
pub async fn apply_shop_server(client: &Client, ns: &str) -> McpServer {
    let spec = json!({"workloadRef": {"name": "shop"}, "upstream": {"port": 8080}});
    apply(client, ns, server("shop", spec)).await
}

/// Deletes McpServer `name` and waits until it is gone (its finalizer ran).
pub async fn delete_and_wait_gone(client: &Client, ns: &str, name: &str) {
    let api: Api<McpServer> = Api::namespaced(client.clone(), ns);
    api.delete(name, &kube::api::DeleteParams::default())
        .await
        .expect("delete");
    eventually(
        &format!("McpServer {name} gone (finalizer done)"),
        Duration::from_secs(30),
        || async { api.get_opt(name).await.expect("get").is_none().then_some(()) },
    )
    .await;
}

/// An McpServer `name`; without `auth` in `spec`, it serves without authentication, said
/// explicitly (`auth.mode: none`).
pub fn server(name: &str, mut spec: Value) -> Value {
    if spec.get("auth").is_none() {
        spec["auth"] = json!({"mode": "none"});
    }
    json!({"apiVersion": "toolgate.dev/v1alpha1", "kind": "McpServer", "metadata": {"name": name}, "spec": spec})
}

/// An McpTool of server `shop` (`GET /customers/{id}` unless `extra` says otherwise).
pub fn tool(object: &str, name: &str, extra: Value) -> Value {
    let mut spec = json!({
        "serverRef": {"name": "shop"},
        "name": name,
        "description": format!("{name}: look up a customer"),
        "inputSchema": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]},
        "http": {"method": "GET", "path": "/customers/{id}"}
    });
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        spec[k] = v;
    }
    json!({"apiVersion": "toolgate.dev/v1alpha1", "kind": "McpTool", "metadata": {"name": object}, "spec": spec})
}

/// A bare HTTP/1.0 GET on loopback; the body on 200.
pub fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    (head.split(' ').nth(1) == Some("200")).then(|| body.to_string())
}

/// The pod template of Deployment `name`.
pub async fn template(client: &Client, ns: &str, name: &str) -> Value {
    let d = Api::<Deployment>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .expect("deployment");
    serde_json::to_value(d.spec.expect("spec").template).unwrap()
}

/// `status.conditions[type]` of a custom object as (status, reason, message).
pub fn condition(object: &Value, type_: &str) -> Option<(String, String, String)> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .map(|c| {
            (
                c["status"].as_str().unwrap_or_default().to_string(),
                c["reason"].as_str().unwrap_or_default().to_string(),
                c["message"].as_str().unwrap_or_default().to_string(),
            )
        })
}

/// Plays the kubelet for one ConfigMap: projects its data into `dir` the way a volume mount
/// does (`..<stamp>/` holding the files, `..data` → it, swapped atomically; each key a
/// symlink through `..data`), and again whenever the ConfigMap changes.
pub struct Projection {
    pub dir: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl Projection {
    pub async fn start(client: &Client, ns: &str, name: &str, dir: PathBuf) -> Self {
        let api: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), ns);
        let first = eventually(&format!("ConfigMap {name}"), Duration::from_secs(30), || async {
            api.get_opt(name).await.ok().flatten()
        })
        .await;
        std::fs::create_dir_all(&dir).unwrap();
        let mut version = first.metadata.resource_version.clone();
        project(&dir, &first.data.clone().unwrap_or_default());
        let d = dir.clone();
        let name = name.to_string();
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let Ok(Some(cm)) = api.get_opt(&name).await else {
                    continue;
                };
                if cm.metadata.resource_version != version {
                    version = cm.metadata.resource_version.clone();
                    project(&d, &cm.data.clone().unwrap_or_default());
                }
            }
        });
        Self { dir, task }
    }
}

impl Drop for Projection {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn project(dir: &Path, data: &BTreeMap<String, String>) {
    let stamp = format!(
        "..{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let target = dir.join(&stamp);
    std::fs::create_dir(&target).unwrap();
    for (k, v) in data {
        std::fs::write(target.join(k), v).unwrap();
    }
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&stamp, &tmp).unwrap();
    let old = std::fs::read_link(dir.join("..data")).ok();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    for k in data.keys() {
        let link = dir.join(k);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new("..data").join(k), &link).unwrap();
        }
    }
    if let Some(old) = old {
        let _ = std::fs::remove_dir_all(dir.join(old));
    }
}

/// The Python interpreter of the venv made by tests/clients/install.sh.
pub fn python() -> PathBuf {
    let p = std::env::var_os("TOOLGATE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let cache = std::env::var_os("TOOLGATE_CACHE")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/toolgate"));
            cache.join("venv/bin/python")
        });
    assert!(
        p.exists(),
        "{} is missing: run tests/clients/install.sh (the official MCP Python SDK)",
        p.display()
    );
    p
}

/// One session of the official MCP Python SDK (e2e/mcp_client.py) against `url`.
pub fn mcp_client(url: &str, call: Option<(&str, Value)>) -> Value {
    let mut cmd = Command::new(python());
    cmd.arg(repo().join("e2e/mcp_client.py")).arg(url);
    if let Some((tool, args)) = call {
        cmd.arg(tool).arg(args.to_string());
    }
    let out = cmd.output().expect("run the MCP client");
    assert!(
        out.status.success(),
        "MCP client failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("client output is JSON")
}

/// Stops kube-apiserver and starts it again on the same port and etcd.
pub fn restart_apiserver() {
    let status = Command::new(repo().join("e2e/control-plane.sh"))
        .arg("restart-apiserver")
        .arg(&control_plane().dir)
        .stdout(Stdio::null())
        .status()
        .expect("run e2e/control-plane.sh");
    assert!(status.success(), "restart-apiserver failed");
}

pub const WAIT: Duration = Duration::from_secs(30);

/// McpServer `name` as JSON.
pub async fn get_server(c: &Client, ns: &str, name: &str) -> Value {
    serde_json::to_value(
        Api::<McpServer>::namespaced(c.clone(), ns)
            .get(name)
            .await
            .expect("server"),
    )
    .unwrap()
}

/// McpTool `name` as JSON.
pub async fn get_tool(c: &Client, ns: &str, name: &str) -> Value {
    serde_json::to_value(Api::<McpTool>::namespaced(c.clone(), ns).get(name).await.expect("tool")).unwrap()
}

/// Waits until `kind` `name` has condition `type_` with `status` and `reason`; its message.
pub async fn wait_condition(
    c: &Client,
    ns: &str,
    kind: &str,
    name: &str,
    type_: &str,
    status: &str,
    reason: &str,
) -> String {
    let what = format!("{kind} {ns}/{name} {type_}={status} ({reason})");
    let mut last = Value::Null;
    let found = tokio::time::timeout(WAIT, async {
        loop {
            let o = if kind == "McpServer" {
                get_server(c, ns, name).await
            } else {
                get_tool(c, ns, name).await
            };
            if let Some((s, r, m)) = condition(&o, type_) {
                if s == status && r == reason {
                    return m;
                }
            }
            last = o["status"].clone();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    found.unwrap_or_else(|_| panic!("timed out waiting for {what}; last status: {last}"))
}

/// The code and message of an API error.
pub fn api_error(e: kube::Error) -> (u16, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.message),
        other => panic!("expected an API error, got {other}"),
    }
}

/// The rendered proxy config of McpServer `name` in `ns`, once its ConfigMap exists.
pub async fn config_text(c: &Client, ns: &str, name: &str) -> Option<String> {
    let cm = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(c.clone(), ns)
        .get_opt(&format!("{name}-toolgate"))
        .await
        .ok()??;
    cm.data?.get(toolgate_operator::render::CONFIG_KEY).cloned()
}

/// Tools in a rendered config (0 when it is not one).
pub fn rendered_tools(text: &str) -> usize {
    serde_json::from_str::<Value>(text)
        .ok()
        .and_then(|v| v["tools"].as_array().map(Vec::len))
        .unwrap_or(0)
}

/// Every version of every ConfigMap in `ns`, as (name, tools rendered in it), in the order the
/// API server reported them; the watch resumes from the last version seen across API server
/// and etcd restarts, so no write in between is missed.
pub struct ConfigWrites {
    seen: std::sync::Arc<std::sync::Mutex<Vec<(String, usize)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl ConfigWrites {
    pub fn watch(client: &Client, ns: &str) -> Self {
        use futures::StreamExt;
        use k8s_openapi::api::core::v1::ConfigMap;
        use kube::runtime::{watcher, WatchStreamExt};
        let seen: std::sync::Arc<std::sync::Mutex<Vec<(String, usize)>>> = Default::default();
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        let out = seen.clone();
        let task = tokio::spawn(async move {
            let mut last: BTreeMap<String, String> = BTreeMap::new();
            let mut events = watcher(api, watcher::Config::default())
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(ev) = events.next().await {
                let Ok(cm) = ev else { continue };
                let name = cm.metadata.name.clone().unwrap_or_default();
                let rv = cm.metadata.resource_version.clone().unwrap_or_default();
                // A re-list after a restart reports the current version again.
                if last.get(&name) == Some(&rv) {
                    continue;
                }
                last.insert(name.clone(), rv);
                let Some(text) = cm
                    .data
                    .as_ref()
                    .and_then(|d| d.get(toolgate_operator::render::CONFIG_KEY))
                else {
                    continue;
                };
                out.lock().unwrap().push((name, rendered_tools(text)));
            }
        });
        Self { seen, task }
    }

    /// What was seen so far.
    pub fn seen(&self) -> Vec<(String, usize)> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for ConfigWrites {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Applies `objects` `at_once` at a time.
pub async fn apply_all(client: &Client, ns: &str, objects: Vec<Value>, at_once: usize) {
    use futures::StreamExt;
    futures::stream::iter(objects)
        .for_each_concurrent(at_once, |o| async move {
            let kind = o["kind"].as_str().unwrap_or_default().to_string();
            match kind.as_str() {
                "McpTool" => {
                    let _: McpTool = apply(client, ns, o).await;
                }
                "McpServer" => {
                    let _: McpServer = apply(client, ns, o).await;
                }
                "Deployment" => {
                    let _: Deployment = apply(client, ns, o).await;
                }
                other => panic!("apply_all: {other}"),
            }
        })
        .await;
}
