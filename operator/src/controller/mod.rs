//! The controllers: McpServer (renders, injects, reports) and McpTool (reports tools whose
//! server does not exist). Context, errors, backoff and the watches live here.

mod index;
mod keys;
mod owned;
mod placement;
mod report;
mod server;
mod tool;
mod triggers;
mod written;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};

use crate::crd::{McpServer, McpServerStatus, McpTool, McpToolStatus};
use crate::guard::Guard;
use crate::inject::{ProxyDefaults, SERVER_ANNOTATION};
use crate::metrics::Metrics;
use crate::objects::MANAGED_BY;

/// The one server-side-apply field manager of the operator.
pub const MANAGER: &str = "toolgate.dev/operator";
/// Finalizer on McpServers: the sidecar is removed from the Deployment before the server goes.
pub const FINALIZER: &str = "toolgate.dev/cleanup";

/// A reconcile failure. Metric labels come from [`Error::reason`], never from the text.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API request failed.
    #[error("Kubernetes API request failed: {0}")]
    Kube(#[from] kube::Error),
    /// The finalizer could not be added or removed.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
}

impl Error {
    /// A bounded label value.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(s)) if s.code == 409 => "Conflict",
            Error::Kube(kube::Error::Api(s)) if s.code == 403 => "Forbidden",
            Error::Kube(kube::Error::Api(s)) if s.code == 422 => "Invalid",
            Error::Kube(kube::Error::Api(_)) => "ApiError",
            Error::Kube(_) => "ClientError",
            Error::Finalizer(_) => "Finalizer",
        }
    }
}

/// What the reconcilers share.
pub struct Context {
    /// API client.
    pub client: Client,
    /// Event recorder.
    pub recorder: Recorder,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Image and other pod defaults.
    pub defaults: ProxyDefaults,
    /// What McpServer authors may make the operator do.
    pub guard: Guard,
    /// Every McpServer in scope.
    pub servers: Store<McpServer>,
    /// Every McpTool in scope.
    pub tools: Store<McpTool>,
    /// Every Deployment in scope (targets, carriers of a sidecar, gateways), without
    /// `managedFields`.
    pub deployments: Store<Deployment>,
    /// ConfigMaps labelled as the operator's.
    pub configmaps: Store<ConfigMap>,
    /// Services labelled as the operator's.
    pub services: Store<Service>,
    /// Metadata of every Service in scope (a gateway's upstream opting in).
    pub upstreams: Store<PartialObjectMeta<Service>>,
    /// Metadata of every Secret in scope (mounts: present, and labelled for the proxy).
    pub secrets: Store<PartialObjectMeta<Secret>>,
    /// Secrets labelled as the operator's (the session keys), with their data.
    pub session_keys: Store<Secret>,
    /// Which caches hold a complete list.
    ready: Readiness,
    /// Which tools name which server.
    tool_index: Arc<index::ToolIndex>,
    /// Which tools each server last rendered, so a tool moving to another server also
    /// reconciles the one it left.
    served: Arc<index::Served>,
    /// Statuses written that the caches may not show yet.
    server_statuses: written::Written<McpServerStatus>,
    tool_statuses: written::Written<McpToolStatus>,
    /// `ns/tool` → when its server was first found missing (see [`tool::SERVER_GRACE`]).
    missing_servers: Mutex<HashMap<String, Instant>>,
    failures: Mutex<HashMap<String, u32>>,
}

impl Context {
    fn backoff(&self, key: String) -> Duration {
        let mut f = self.failures.lock().expect("lock");
        let n = f.entry(key).or_insert(0);
        *n = (*n + 1).min(16);
        let secs = (1u64 << (*n - 1).min(9)).min(300);
        // Up to 25% jitter so many failing objects do not retry in lockstep.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos() as u64)
            .unwrap_or(0);
        let jitter = nanos % (secs * 250 + 1);
        Duration::from_secs(secs) + Duration::from_millis(jitter)
    }

    fn reset(&self, key: &str) {
        self.failures.lock().expect("lock").remove(key);
    }

    /// Waits until every watch cache a reconcile reads holds a complete list, so a restarted
    /// operator never renders a server from the objects seen so far.
    pub(super) async fn caches_ready(&self) {
        self.ready.wait().await;
    }
}

/// Which of the watch caches hold a complete list: each watch marks its bit when it first
/// passes `InitDone`, which the reflector has applied by then. Not `Store::wait_until_ready`:
/// it wakes only the last of several concurrent waiters (a oneshot receiver keeps one waker),
/// and reconciles of both controllers wait at once, so one of them could sleep forever.
#[derive(Clone)]
struct Readiness(Arc<tokio::sync::watch::Sender<u32>>);

impl Readiness {
    /// Caches: servers, tools, deployments, Secret metadata, ConfigMaps, Services, session
    /// keys, upstream Service metadata.
    const CACHES: u32 = 8;

    fn new() -> Self {
        Self(Arc::new(tokio::sync::watch::channel(0).0))
    }

    /// Marks cache `bit` ready on its watch's first `InitDone`.
    fn marker<K>(&self, bit: u32) -> impl FnMut(&watcher::Event<K>) {
        let tx = self.0.clone();
        move |event| {
            if matches!(event, watcher::Event::InitDone) {
                tx.send_if_modified(|m| {
                    let before = *m;
                    *m |= 1 << bit;
                    *m != before
                });
            }
        }
    }

    async fn wait(&self) {
        let all = (1 << Self::CACHES) - 1;
        let _ = self.0.subscribe().wait_for(|m| *m == all).await;
    }
}

/// `ns/name` in `store`.
pub(crate) fn cached<K>(store: &Store<K>, ns: &str, name: &str) -> Option<Arc<K>>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    store.get(&ObjectRef::new(name).within(ns))
}

/// `name` from a cache of the operator's labelled objects, or else from the API: a miss means
/// absent, or present without the operator's label (someone else's object of that name).
/// Only the miss costs a read.
pub(crate) async fn cached_or_read<K>(
    ctx: &Context,
    store: &Store<K>,
    ns: &str,
    name: &str,
) -> Result<Option<Arc<K>>, Error>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    if let Some(hit) = cached(store, ns, name) {
        return Ok(Some(hit));
    }
    ctx.metrics.read(kind_label::<K>());
    let api: Api<K> = Api::namespaced(ctx.client.clone(), ns);
    Ok(api.get_opt(name).await?.map(Arc::new))
}

/// A bounded `kind` label.
pub(crate) fn kind_label<K: Resource>() -> &'static str
where
    K::DynamicType: Default,
{
    match K::kind(&K::DynamicType::default()).as_ref() {
        "ConfigMap" => "ConfigMap",
        "Service" => "Service",
        "Deployment" => "Deployment",
        "Secret" => "Secret",
        "McpServer" => "McpServer",
        "McpTool" => "McpTool",
        _ => "other",
    }
}

/// Settings of [`run`].
#[derive(Debug, Clone, Default)]
pub struct RunConfig {
    /// Watch this namespace only; all namespaces when `None`.
    pub namespace: Option<String>,
    /// Pod defaults.
    pub defaults: ProxyDefaults,
    /// What McpServer authors may make the operator do.
    pub guard: Guard,
    /// Reporting instance for Events (pod name).
    pub instance: Option<String>,
}

fn api<K>(client: &Client, ns: &Option<String>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

fn key<K: Resource>(o: &K) -> String {
    format!(
        "{}/{}",
        o.meta().namespace.as_deref().unwrap_or(""),
        o.meta().name.as_deref().unwrap_or("")
    )
}

/// Servers referencing Secret `name` in `ns`.
fn servers_using_secret(servers: &Store<McpServer>, ns: &str, name: &str) -> Vec<ObjectRef<McpServer>> {
    servers
        .state()
        .iter()
        .filter(|s| s.metadata.namespace.as_deref() == Some(ns))
        .filter(|s| server::secret_names(s).iter().any(|n| n == name))
        .map(|s| ObjectRef::from_obj(&**s))
        .collect()
}

/// Runs both controllers until `shutdown` completes, then drains in-flight reconciles.
pub async fn run(
    client: Client,
    cfg: RunConfig,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let ns = cfg.namespace.clone();
    let ready = Readiness::new();
    let (servers, server_writer) = reflector::store::<McpServer>();
    let (tools, tool_writer) = reflector::store::<McpTool>();
    let (deployments, deployment_writer) = reflector::store::<Deployment>();
    let (configmaps, configmap_writer) = reflector::store::<ConfigMap>();
    let (services, service_writer) = reflector::store::<Service>();
    let (upstreams, upstream_writer) = reflector::store::<PartialObjectMeta<Service>>();
    let (secrets, secret_writer) = reflector::store::<PartialObjectMeta<Secret>>();
    let (session_keys, session_key_writer) = reflector::store::<Secret>();

    // McpServer: spec changes, deletion and finalizer changes; status-only updates are skipped.
    let server_stream = watcher(api::<McpServer>(&client, &ns), watcher::Config::default())
        .default_backoff()
        .modify(|s| s.managed_fields_mut().clear())
        .reflect(server_writer)
        .inspect_ok(ready.marker(0))
        .applied_objects()
        .predicate_filter(server_changed, Default::default());

    // One watch and one cache of McpTools for both controllers (10,000 tools are most of the
    // operator's memory): each change goes on to the McpTool controller once it is cached
    // and indexed. A tool's status (which the operator writes) starts no reconcile.
    let tool_index = Arc::new(index::ToolIndex::default());
    let (tool_tx, tool_rx) = futures::channel::mpsc::unbounded::<McpTool>();
    let tool_stream = triggers::changes(
        watcher(api::<McpTool>(&client, &ns), watcher::Config::default())
            .default_backoff()
            .modify(|t| t.managed_fields_mut().clear())
            .reflect(tool_writer)
            .inspect_ok({
                let tool_index = tool_index.clone();
                move |e| tool_index.observe(e)
            })
            .inspect_ok(ready.marker(1)),
        triggers::tool_inputs,
    )
    .inspect_ok(move |t| {
        let _ = tool_tx.unbounded_send(t.clone());
    });
    // Each trigger stream fills its cache before it triggers, so a reconcile it starts sees
    // the change that started it. `managedFields` are dropped: nothing reads them.
    let deployment_stream = watcher(api::<Deployment>(&client, &ns), watcher::Config::default())
        .default_backoff()
        .modify(|d| d.managed_fields_mut().clear())
        .reflect(deployment_writer)
        .inspect_ok(ready.marker(2))
        .touched_objects();
    let secret_stream = watcher(
        api::<PartialObjectMeta<Secret>>(&client, &ns),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(|s| s.managed_fields_mut().clear())
    .reflect(secret_writer)
    .inspect_ok(ready.marker(3))
    .touched_objects();
    let owned = watcher::Config::default().labels(&format!("{}={}", MANAGED_BY.0, MANAGED_BY.1));
    let cm_stream = watcher(api::<ConfigMap>(&client, &ns), owned.clone())
        .default_backoff()
        .modify(|c| c.managed_fields_mut().clear())
        .reflect(configmap_writer)
        .inspect_ok(ready.marker(4))
        .touched_objects();
    let svc_stream = watcher(api::<Service>(&client, &ns), owned.clone())
        .default_backoff()
        .modify(|s| s.managed_fields_mut().clear())
        .reflect(service_writer)
        .inspect_ok(ready.marker(5))
        .touched_objects();
    let session_key_stream = watcher(api::<Secret>(&client, &ns), owned)
        .default_backoff()
        .modify(|s| s.managed_fields_mut().clear())
        .reflect(session_key_writer)
        .inspect_ok(ready.marker(6))
        .touched_objects();

    // Every Service's metadata: a gateway's upstream Service opting in or out.
    let upstream_svc_stream = watcher(
        api::<PartialObjectMeta<Service>>(&client, &ns),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(|s| s.managed_fields_mut().clear())
    .reflect(upstream_writer)
    .inspect_ok(ready.marker(7))
    .touched_objects();

    let reporter = Reporter {
        controller: "toolgate-operator".into(),
        instance: cfg.instance.clone(),
    };
    let served: Arc<index::Served> = Arc::default();
    let ctx = Arc::new(Context {
        client: client.clone(),
        recorder: Recorder::new(client.clone(), reporter),
        metrics: metrics.clone(),
        defaults: cfg.defaults.clone(),
        guard: cfg.guard.clone(),
        servers: servers.clone(),
        tools: tools.clone(),
        deployments: deployments.clone(),
        configmaps,
        services,
        upstreams,
        secrets,
        session_keys,
        ready: ready.clone(),
        tool_index: tool_index.clone(),
        served: served.clone(),
        server_statuses: Default::default(),
        tool_statuses: Default::default(),
        missing_servers: Mutex::default(),
        failures: Mutex::default(),
    });

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });

    let by_tool = {
        let served = served.clone();
        move |t: McpTool| {
            let ns = t.metadata.namespace.clone().unwrap_or_default();
            let mut refs = vec![ObjectRef::<McpServer>::new(&t.spec.server_ref.name).within(&ns)];
            let before = served.server_of(&ns, &t.name_any());
            if let Some(prev) = before.filter(|p| *p != t.spec.server_ref.name) {
                refs.push(ObjectRef::new(&prev).within(&ns));
            }
            refs
        }
    };
    let by_deployment = {
        let servers = servers.clone();
        move |d: Deployment| {
            let ns = d.metadata.namespace.clone().unwrap_or_default();
            let name = d.metadata.name.clone().unwrap_or_default();
            let mut refs: Vec<ObjectRef<McpServer>> = servers
                .state()
                .iter()
                .filter(|s| s.metadata.namespace.as_deref() == Some(&ns))
                .filter(|s| s.spec.workload_ref.as_ref().is_some_and(|w| w.name == name))
                .map(|s| ObjectRef::from_obj(&**s))
                .collect();
            if let Some(owner) = d.annotations().get(SERVER_ANNOTATION) {
                refs.push(ObjectRef::new(owner).within(&ns));
            }
            for o in d.owner_references().iter().filter(|o| o.kind == "McpServer") {
                refs.push(ObjectRef::new(&o.name).within(&ns));
            }
            refs
        }
    };
    let by_upstream_service = {
        let servers = servers.clone();
        move |svc: PartialObjectMeta<Service>| {
            let ns = svc.metadata.namespace.clone().unwrap_or_default();
            let name = svc.name_any();
            servers
                .state()
                .iter()
                .filter(|s| s.metadata.namespace.as_deref() == Some(&ns))
                .filter(|s| s.spec.upstream.service.as_ref().is_some_and(|u| u.name == name))
                .map(|s| ObjectRef::from_obj(&**s))
                .collect::<Vec<_>>()
        }
    };
    let by_secret = {
        let servers = servers.clone();
        move |s: PartialObjectMeta<Secret>| {
            servers_using_secret(&servers, s.metadata.namespace.as_deref().unwrap_or(""), &s.name_any())
        }
    };

    let server_controller = Controller::for_stream(server_stream, servers.clone())
        .with_config(
            ControllerConfig::default()
                .debounce(Duration::from_millis(200))
                .concurrency(8),
        )
        .owns_stream(cm_stream)
        .owns_stream(svc_stream)
        .owns_stream(session_key_stream)
        .watches_stream(tool_stream, by_tool)
        .watches_stream(deployment_stream, by_deployment)
        .watches_stream(secret_stream, by_secret)
        .watches_stream(upstream_svc_stream, by_upstream_service)
        .graceful_shutdown_on(stopped(stop_rx.clone()))
        .run(server::reconcile, server::error_policy, ctx.clone())
        .for_each(|_| async {});

    // A server appearing or going away: its tools' ServerNotFound comes or goes. Its other
    // updates (every status write) say nothing to a tool.
    let server_meta_stream = triggers::changes(
        watcher(
            api::<PartialObjectMeta<McpServer>>(&client, &ns),
            watcher::Config::default(),
        )
        .default_backoff(),
        |_| 0,
    );
    let tool_controller = Controller::for_stream(tool_rx.map(Ok::<_, watcher::Error>), tools.clone())
        .with_config(
            ControllerConfig::default()
                .debounce(Duration::from_millis(200))
                .concurrency(8),
        )
        .watches_stream(server_meta_stream, move |s: PartialObjectMeta<McpServer>| {
            let ns = s.metadata.namespace.clone().unwrap_or_default();
            tool_index
                .tools_of(&ns, &s.name_any())
                .into_iter()
                .map(|t| ObjectRef::new(&t).within(&ns))
                .collect::<Vec<_>>()
        })
        .graceful_shutdown_on(stopped(stop_rx))
        .run(tool::reconcile, tool::error_policy, ctx.clone())
        .for_each(|_| async {});

    let gauges = {
        let metrics = metrics.clone();
        let ctx = ctx.clone();
        async move {
            loop {
                // Tools deleted while they waited for their server leave an entry behind.
                ctx.missing_servers.lock().expect("lock").retain(|k, _| {
                    let (ns, name) = k.split_once('/').unwrap_or_default();
                    cached(&ctx.tools, ns, name).is_some()
                });
                metrics
                    .managed
                    .with_label_values(&["McpServer"])
                    .set(servers.state().len() as i64);
                let tools = tools.state();
                metrics.managed.with_label_values(&["McpTool"]).set(tools.len() as i64);
                let accepted = tools
                    .iter()
                    .filter(|t| {
                        t.status.as_ref().is_some_and(|s| {
                            s.conditions
                                .iter()
                                .any(|c| c.type_ == crate::status::kind::ACCEPTED && c.status == "True")
                        })
                    })
                    .count() as i64;
                metrics.tools.with_label_values(&["true"]).set(accepted);
                metrics
                    .tools
                    .with_label_values(&["false"])
                    .set(tools.len() as i64 - accepted);
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        }
    };
    tokio::select! {
        _ = futures::future::join(server_controller, tool_controller) => {}
        _ = gauges => {}
    }
}

fn server_changed(s: &McpServer) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    s.metadata.generation.hash(&mut h);
    s.metadata.deletion_timestamp.is_some().hash(&mut h);
    s.finalizers().hash(&mut h);
    s.metadata.uid.hash(&mut h);
    Some(h.finish())
}

/// Records the outcome of one reconcile.
fn observe(ctx: &Context, controller: &'static str, started: Instant, result: &Result<Action, Error>) {
    let m = &ctx.metrics;
    m.reconcile_duration
        .with_label_values(&[controller])
        .observe(started.elapsed().as_secs_f64());
    match result {
        Ok(_) => m.reconciles.with_label_values(&[controller, "ok"]).inc(),
        Err(e) => {
            m.reconciles.with_label_values(&[controller, "error"]).inc();
            m.reconcile_errors.with_label_values(&[controller, e.reason()]).inc();
        }
    }
}
