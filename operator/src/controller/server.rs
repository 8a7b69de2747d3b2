//! McpServer reconcile: render, apply the ConfigMap, inject the sidecar (or run the
//! gateway), expose the Service, and report on the server and each of its tools. Every
//! write is skipped when the live object already holds what would be written, and objects
//! the server does not own are never taken over.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::core::{Selector, SelectorExt};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event as KubeEvent, EventType};
use kube::runtime::finalizer::{finalizer, Error as FinalizerError, Event};
use kube::{Api, Resource, ResourceExt};
use serde_json::{json, Value};
use tracing::{info, instrument, warn};

use super::{cached, cached_or_read, key, observe, Context, Error, FINALIZER, MANAGER};
use crate::crd::{HasConditions, McpServer, McpServerStatus, McpTool, McpToolStatus, ServerMode, ServerSessions};
use crate::inject::{self, applied_hash, CONTAINER, HASH_ANNOTATION, SERVER_ANNOTATION};
use crate::objects;
use crate::render::{self, configmap_name, render, service_name, Rendered, Verdict};
use crate::status::{condition, kind, merge, reason};

/// Event notes are capped at 1024 bytes by the API.
const NOTE_LIMIT: usize = 1000;
/// Tool status writes in flight per server reconcile.
const TOOL_STATUS_WRITES: usize = 8;

/// Names of the Secrets a server references.
pub(super) fn secret_names(s: &McpServer) -> Vec<String> {
    let mut names = Vec::new();
    if let Some(c) = &s.spec.upstream.credential {
        names.push(c.secret_ref.name.clone());
    }
    if let Some(a) = &s.spec.auth {
        if let Some(r) = &a.credentials_secret_ref {
            names.push(r.name.clone());
        }
        if let Some(r) = a.oauth.as_ref().and_then(|o| o.jwks_secret_ref.as_ref()) {
            names.push(r.name.clone());
        }
    }
    if let Some(redis) = s
        .spec
        .rate_limit
        .as_ref()
        .and_then(|r| r.store.as_ref())
        .map(|st| &st.redis)
    {
        names.extend(redis.password_secret_ref.iter().map(|r| r.name.clone()));
        names.extend(redis.ca_secret_ref.iter().map(|r| r.name.clone()));
    }
    // The operator's own: deleting it makes a new one.
    if ServerSessions::sealed(s.spec.sessions.as_ref()) {
        names.push(render::session_secret_name(s));
    }
    names
}

fn backoff_key(server: &McpServer) -> String {
    format!("McpServer/{}", key(server))
}

#[instrument(skip_all, fields(server = %key(&*server)))]
pub(super) async fn reconcile(server: Arc<McpServer>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let k = backoff_key(&server);
    // Every cache must hold a complete list, or a restart would render a server with the
    // tools seen so far.
    ctx.caches_ready().await;
    let api: Api<McpServer> = Api::namespaced(ctx.client.clone(), &server.namespace().unwrap_or_default());
    // `finalizer` patches the object to add the finalizer first, or to remove it once the
    // cleanup is done: one write either way.
    let has_finalizer = server.finalizers().iter().any(|f| f == FINALIZER);
    let finalizer_write = if server.metadata.deletion_timestamp.is_some() {
        has_finalizer
    } else {
        !has_finalizer
    };
    let result = finalizer(&api, FINALIZER, server, |event| async {
        match event {
            Event::Apply(s) => apply(&s, &ctx).await,
            Event::Cleanup(s) => cleanup(&s, &ctx).await,
        }
    })
    .await
    .map_err(|e| match e {
        FinalizerError::ApplyFailed(e) | FinalizerError::CleanupFailed(e) => e,
        other => Error::Finalizer(Box::new(other)),
    });
    if finalizer_write && result.is_ok() {
        ctx.metrics.write("McpServer", "patch");
    }
    observe(&ctx, "mcpserver", started, &result);
    if result.is_ok() {
        ctx.reset(&k);
    }
    result
}

pub(super) fn error_policy(server: Arc<McpServer>, err: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx.backoff(backoff_key(&server));
    warn!(server = %key(&*server), error = %err, retry_in_ms = delay.as_millis() as u64, "reconcile failed");
    Action::requeue(delay)
}

fn now() -> Time {
    let t = k8s_openapi::jiff::Timestamp::now();
    Time(k8s_openapi::jiff::Timestamp::from_second(t.as_second()).unwrap_or(t))
}

/// Tools naming this server in `serverRef`: (selected, not matching `toolSelector`).
fn select_tools(server: &McpServer, ctx: &Context) -> (Vec<McpTool>, Vec<McpTool>) {
    let ns = server.metadata.namespace.as_deref();
    let name = server.name_any();
    let selector: Option<Selector> = server.spec.tool_selector.clone().map(|s| {
        Selector::try_from(s).unwrap_or_else(|e| {
            warn!(error = %e, "toolSelector is not usable; no tool matches it");
            Selector::from_iter([("toolgate.dev/unmatchable", "\u{0}")])
        })
    });
    let ns = ns.unwrap_or_default();
    ctx.tool_index
        .tools_of(ns, &name)
        .iter()
        .filter_map(|t| cached(&ctx.tools, ns, t))
        .filter(|t| t.spec.server_ref.name == name && t.metadata.deletion_timestamp.is_none())
        .map(|t| (*t).clone())
        .partition(|t| selector.as_ref().is_none_or(|s| s.matches(t.labels())))
}

/// Whether every field of `doc` holds the same value in `live` (lists item by item, same
/// length). Fields the API server adds (defaults, status) are ignored.
pub(crate) fn is_subset(doc: &Value, live: &Value) -> bool {
    match (doc, live) {
        // The API server drops empty lists and maps.
        (Value::Object(d), Value::Object(l)) => d.iter().all(|(k, v)| match l.get(k) {
            Some(lv) => is_subset(v, lv),
            None => v.as_array().is_some_and(Vec::is_empty) || v.as_object().is_some_and(|o| o.is_empty()),
        }),
        (Value::Array(d), Value::Array(l)) => d.len() == l.len() && d.iter().zip(l).all(|(a, b)| is_subset(a, b)),
        (d, l) => d == l,
    }
}

pub(super) fn is_owned_by(meta: &ObjectMeta, server: &McpServer) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "McpServer" && Some(&o.uid) == server.metadata.uid.as_ref())
}

/// What [`apply_owned`] did.
#[derive(Debug, PartialEq, Eq)]
enum Applied {
    Unchanged,
    Written,
    /// An object of that name exists and belongs to someone else; left alone.
    Foreign,
}

/// What `live` says about writing `doc`: `None` when it is to be written.
fn verdict<K: Resource + serde::Serialize>(doc: &Value, live: &K, server: &McpServer) -> Option<Applied> {
    if !is_owned_by(live.meta(), server) {
        return Some(Applied::Foreign);
    }
    let same_hash = live
        .meta()
        .annotations
        .as_ref()
        .and_then(|a| a.get(HASH_ANNOTATION))
        .map(String::as_str)
        == applied_hash(doc);
    (same_hash && is_subset(doc, &serde_json::to_value(live).unwrap_or_default())).then_some(Applied::Unchanged)
}

/// Applies `doc` over the version of the object the cache shows (`over`): a cache behind
/// the API server makes that a conflict, never a second write. `Ok(false)`: not written,
/// as the object has moved on since that version (or the cache does not hold it).
async fn apply_over<K>(ctx: &Context, api: &Api<K>, doc: &Value, over: Option<&str>) -> Result<bool, Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    let Some(over) = over else { return Ok(false) };
    let mut guarded = doc.clone();
    guarded["metadata"]["resourceVersion"] = over.into();
    let name = doc["metadata"]["name"].as_str().unwrap_or_default();
    match api
        .patch(name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&guarded))
        .await
    {
        Ok(_) => {
            ctx.metrics.write(super::kind_label::<K>(), "apply");
            Ok(true)
        }
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Applies `doc` unless `cached` (the watch cache's copy) already holds it; never takes over
/// an object the server does not own. The cache may be behind the API server (an object
/// written a moment ago, or one without the operator's label that it does not list): a
/// cached object is written over the version the cache shows, and otherwise the API's own
/// copy decides. A resync reads nothing, and a stale cache costs a read, never a second
/// write.
async fn apply_owned<K>(
    ctx: &Context,
    api: &Api<K>,
    doc: &Value,
    cached: Option<&K>,
    server: &McpServer,
) -> Result<Applied, Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
    K::DynamicType: Default,
{
    if let Some(v) = cached.and_then(|live| verdict(doc, live, server)) {
        return Ok(v);
    }
    // Cached and this server's (else the verdict said Foreign), only not as it should be.
    if apply_over(ctx, api, doc, cached.and_then(|c| c.meta().resource_version.as_deref())).await? {
        return Ok(Applied::Written);
    }
    let name = doc["metadata"]["name"].as_str().unwrap_or_default();
    ctx.metrics.read(super::kind_label::<K>());
    if let Some(v) = api.get_opt(name).await?.and_then(|live| verdict(doc, &live, server)) {
        return Ok(v);
    }
    api.patch(name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(doc))
        .await?;
    ctx.metrics.write(super::kind_label::<K>(), "apply");
    Ok(Applied::Written)
}

pub(super) async fn publish(
    ctx: &Context,
    object: &impl Resource<DynamicType = ()>,
    type_: EventType,
    reason: &str,
    mut note: String,
) {
    if note.len() > NOTE_LIMIT {
        let mut cut = NOTE_LIMIT - 3;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
        note.push_str("...");
    }
    let ev = KubeEvent {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&ev, &object.object_ref(&())).await {
        warn!(error = %e, "could not publish event");
    }
    ctx.metrics.write("Event", "create");
}

pub(super) fn foreign(what: &str, name: &str) -> String {
    format!("{what} {name} exists and is not owned by this McpServer; rename or delete it")
}

async fn apply(server: &McpServer, ctx: &Context) -> Result<Action, Error> {
    let ns = server.namespace().unwrap_or_default();
    let name = server.name_any();
    let generation = server.metadata.generation;
    let client = &ctx.client;
    let (selected, unselected) = select_tools(server, ctx);
    let rendered = render(server, &selected);
    let served = rendered.config.tools.len();
    let current = ctx
        .server_statuses
        .current(
            &key(server),
            server.metadata.resource_version.as_deref(),
            server.status.clone(),
        )
        .unwrap_or_default();

    let mut missing = Vec::new();
    let mut refused = Vec::new();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    // The session keys first, so the mount check below finds them.
    let mut requeue = None;
    let mut key_problem = None;
    // The session-key Secret the operator has just made sure of: the Secret cache may not
    // show it yet, and it is labelled for the proxy.
    let mut key_secret = None;
    if ServerSessions::sealed(server.spec.sessions.as_ref()) && !ctx.guard.protects(&ns) {
        match super::keys::ensure(server, ctx, &secrets).await? {
            Ok(ensured) => {
                requeue = ensured.again;
                key_secret = ensured.present.then(|| render::session_secret_name(server));
            }
            Err(message) => key_problem = Some(message),
        }
    }
    for m in &rendered.mounts {
        if missing.contains(&m.secret) || refused.contains(&m.secret) || key_secret.as_ref() == Some(&m.secret) {
            continue;
        }
        // The cache lists every Secret in scope: no read.
        match cached(&ctx.secrets, &ns, &m.secret) {
            None => missing.push(m.secret.clone()),
            Some(s) if !ctx.guard.secret_allowed(s.metadata.labels.as_ref()) => refused.push(m.secret.clone()),
            Some(_) => {}
        }
    }
    let image = server.spec.image.as_deref().unwrap_or(&ctx.defaults.image);

    let mut conditions = Vec::new();
    if server
        .spec
        .auth
        .as_ref()
        .is_some_and(|a| a.mode == toolgate_config::AuthMode::None)
    {
        let message = "auth.mode is none: every caller is served as anonymous, with the lowest role; set spec.auth to require credentials";
        conditions.push(condition(
            kind::UNAUTHENTICATED,
            true,
            reason::AUTH_MODE_NONE,
            message,
            generation,
        ));
    }
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let cm_name = configmap_name(server);
    // Labelled as the operator's, so in the cache when it is this server's.
    let live_cm = cached(&ctx.configmaps, &ns, &cm_name);
    let has_config = live_cm.as_ref().is_some_and(|cm| is_owned_by(&cm.metadata, server));
    let config_ok = if !rendered.problems.is_empty() {
        let message = format!(
            "the server's settings do not make a valid proxy config, so ConfigMap {cm_name} keeps the last valid one: {}",
            rendered.problems.join("; ")
        );
        conditions.push(condition(
            kind::CONFIG_RENDERED,
            false,
            reason::INVALID_SERVER_CONFIG,
            message,
            generation,
        ));
        has_config
    } else if let Some(why) = rendered.too_large() {
        // Written, the API server would refuse it with a 422 every reconcile.
        let message = format!("{why}; ConfigMap {cm_name} keeps the last config that fit");
        conditions.push(condition(
            kind::CONFIG_RENDERED,
            false,
            reason::CONFIG_TOO_LARGE,
            message,
            generation,
        ));
        has_config
    } else {
        let doc = objects::configmap(server, &rendered);
        match apply_owned(ctx, &cms, &doc, live_cm.as_deref(), server).await? {
            Applied::Foreign => {
                let message = foreign("ConfigMap", &cm_name);
                conditions.push(condition(
                    kind::CONFIG_RENDERED,
                    false,
                    reason::RESOURCE_CONFLICT,
                    message,
                    generation,
                ));
                false
            }
            applied => {
                if applied == Applied::Written {
                    info!(tools = served, hash = %rendered.hash, "config applied");
                    let note = format!(
                        "Rendered {served} tools into ConfigMap {cm_name} (hash {})",
                        &rendered.hash[..12]
                    );
                    publish(ctx, server, EventType::Normal, reason::CONFIG_APPLIED, note).await;
                }
                let message = format!("{served} tools in ConfigMap {cm_name}");
                conditions.push(condition(
                    kind::CONFIG_RENDERED,
                    true,
                    reason::CONFIG_APPLIED,
                    message,
                    generation,
                ));
                true
            }
        }
    };

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let gateway_name = objects::gateway_name(server);
    // The pods the Service selects, once the proxy runs in them.
    let mut selector = None;
    // Why the proxy may not run (first reason wins); `true`: what runs must go too (the owner
    // of a target withdrew, or never gave, consent), `false`: what runs is kept until fixed.
    let blocked = |type_: &str| -> Option<(Condition, bool)> {
        let c = |r: &str, m: String| condition(type_, false, r, m, generation);
        if ctx.guard.protects(&ns) {
            Some((protected(&ns, type_, generation), true))
        } else if let Some(message) = &key_problem {
            // Not the operator's key: nothing may mount it.
            Some((c(reason::RESOURCE_CONFLICT, message.clone()), true))
        } else if !refused.is_empty() {
            let message = format!(
                "Secret {} may not be mounted into the proxy: whoever may write it labels it {}={} (or the operator runs with --trust-namespace-secrets)",
                refused.join(", "),
                crate::guard::SECRET_USAGE_LABEL,
                crate::guard::SECRET_USAGE_PROXY
            );
            Some((c(reason::SECRET_NOT_ALLOWED, message), true))
        } else if !ctx.guard.image_allowed(image, &ctx.defaults.image) {
            let allowed = if ctx.guard.allowed_images.is_empty() {
                crate::guard::repository(&ctx.defaults.image).to_string()
            } else {
                ctx.guard.allowed_images.join(", ")
            };
            let message = format!("spec.image {image} is not an allowed proxy image (allowed: {allowed}, any tag or digest); nothing was changed; the cluster administrator sets --allowed-proxy-images");
            Some((c(reason::IMAGE_NOT_ALLOWED, message), false))
        } else if !missing.is_empty() {
            let message = format!(
                "Secret {} not found in namespace {ns}; the proxy is started once it exists",
                missing.join(", ")
            );
            Some((c(reason::SECRET_NOT_FOUND, message), false))
        } else if !config_ok {
            let message = "no valid config has been rendered yet (see ConfigRendered)".to_string();
            Some((c(reason::INVALID_SERVER_CONFIG, message), false))
        } else {
            None
        }
    };
    match server.spec.mode {
        ServerMode::Sidecar => {
            let target = server
                .spec
                .workload_ref
                .as_ref()
                .map(|w| w.name.clone())
                .unwrap_or_default();
            // The operator's own namespace first: whatever the opt-ins there say.
            let keep = (!ctx.guard.protects(&ns)).then_some(target.as_str());
            remove_sidecars(ctx, server, keep, None).await?;
            if let Some(gw) = cached(&ctx.deployments, &ns, &gateway_name) {
                if is_owned_by(&gw.metadata, server) {
                    deployments.delete(&gateway_name, &DeleteParams::background()).await?;
                    ctx.metrics.write("Deployment", "delete");
                }
            }
            let live_target = if ctx.guard.protects(&ns) {
                None
            } else {
                cached(&ctx.deployments, &ns, &target)
            };
            let cond = match live_target {
                None if ctx.guard.protects(&ns) => protected(&ns, kind::SIDECAR_INJECTED, generation),
                None => {
                    let message = format!(
                        "Deployment {target} not found in namespace {ns}; create it or fix spec.workloadRef.name"
                    );
                    condition(
                        kind::SIDECAR_INJECTED,
                        false,
                        reason::WORKLOAD_NOT_FOUND,
                        message,
                        generation,
                    )
                }
                Some(d) => match claimed_by_other(ctx, &d, &name) {
                    Some(other) => {
                        let message = format!(
                            "Deployment {target} already carries the sidecar of McpServer {other}; a Deployment serves one McpServer"
                        );
                        condition(
                            kind::SIDECAR_INJECTED,
                            false,
                            reason::WORKLOAD_IN_USE,
                            message,
                            generation,
                        )
                    }
                    None if !crate::guard::workload_opted_in(d.metadata.annotations.as_ref(), &name) => {
                        remove_sidecars(ctx, server, None, Some(&target)).await?;
                        let message = format!(
                            "Deployment {target} has not opted in: whoever may edit it adds the annotation {}: {name} to its metadata (removing it takes the sidecar out again)",
                            crate::guard::WORKLOAD_OPT_IN
                        );
                        condition(
                            kind::SIDECAR_INJECTED,
                            false,
                            reason::WORKLOAD_NOT_OPTED_IN,
                            message,
                            generation,
                        )
                    }
                    None => {
                        let pods = d.spec.as_ref().and_then(|s| s.selector.match_labels.clone());
                        match blocked(kind::SIDECAR_INJECTED) {
                            Some((c, revoke)) => {
                                if revoke {
                                    remove_sidecars(ctx, server, None, Some(&target)).await?;
                                } else if carries_sidecar_of(&d, &name) {
                                    selector = Some(pods.unwrap_or_default());
                                }
                                c
                            }
                            None => {
                                inject_sidecar(ctx, server, &deployments, &d, &target, &rendered).await?;
                                selector = Some(pods.unwrap_or_default());
                                let message = format!("Deployment {target} runs {CONTAINER} as a native sidecar");
                                condition(
                                    kind::SIDECAR_INJECTED,
                                    true,
                                    reason::SIDECAR_INJECTED,
                                    message,
                                    generation,
                                )
                            }
                        }
                    }
                },
            };
            conditions.push(cond);
        }
        ServerMode::Gateway => {
            remove_sidecars(ctx, server, None, None).await?;
            let live = cached(&ctx.deployments, &ns, &gateway_name);
            let ours = live.as_ref().is_some_and(|d| is_owned_by(&d.metadata, server));
            // The Service behind the gateway must agree to be fronted, as a workload must agree
            // to carry a sidecar: an McpServer author could otherwise expose any Service.
            let upstream = server
                .spec
                .upstream
                .service
                .as_ref()
                .map(|s| s.name.clone())
                .unwrap_or_default();
            let target = cached(&ctx.upstreams, &ns, &upstream);
            let consent = match &target {
                None => Some((
                    reason::UPSTREAM_NOT_FOUND,
                    format!("Service {upstream} not found in namespace {ns}; create it or fix spec.upstream.service.name"),
                )),
                Some(t) if !crate::guard::workload_opted_in(t.metadata.annotations.as_ref(), &name) => Some((
                    reason::UPSTREAM_NOT_OPTED_IN,
                    format!(
                        "Service {upstream} has not opted in: whoever may edit it adds the annotation {}: {name} to its metadata (removing it takes the gateway down again)",
                        crate::guard::WORKLOAD_OPT_IN
                    ),
                )),
                Some(_) => None,
            };
            let refused = consent.map(|(r, m)| (condition(kind::GATEWAY_AVAILABLE, false, r, m, generation), true));
            let cond = match refused.or_else(|| blocked(kind::GATEWAY_AVAILABLE)) {
                Some((c, revoke)) => {
                    if revoke && ours {
                        deployments.delete(&gateway_name, &DeleteParams::background()).await?;
                        ctx.metrics.write("Deployment", "delete");
                    } else if ours {
                        selector = Some(objects::gateway_selector(server));
                    }
                    c
                }
                None => {
                    let doc = objects::gateway(server, &rendered, &ctx.defaults);
                    if apply_owned(ctx, &deployments, &doc, live.as_deref(), server).await? == Applied::Foreign {
                        let message = foreign("Deployment", &gateway_name);
                        condition(
                            kind::GATEWAY_AVAILABLE,
                            false,
                            reason::RESOURCE_CONFLICT,
                            message,
                            generation,
                        )
                    } else {
                        selector = Some(objects::gateway_selector(server));
                        let available = live
                            .and_then(|d| d.status.clone())
                            .and_then(|s| s.available_replicas)
                            .unwrap_or(0);
                        let want = server.spec.replicas.unwrap_or(2);
                        if available > 0 {
                            let message = format!("{available}/{want} gateway replicas available");
                            condition(
                                kind::GATEWAY_AVAILABLE,
                                true,
                                reason::GATEWAY_AVAILABLE,
                                message,
                                generation,
                            )
                        } else {
                            let message = format!("0/{want} replicas of Deployment {gateway_name} available yet");
                            condition(
                                kind::GATEWAY_AVAILABLE,
                                false,
                                reason::GATEWAY_PROGRESSING,
                                message,
                                generation,
                            )
                        }
                    }
                }
            };
            conditions.push(cond);
        }
    }

    // The Service fronts the proxy only: it exists while a proxy runs behind it.
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let svc_name = service_name(server);
    let mut service_problem = None;
    // Labelled as the operator's, so in the cache when it is this server's.
    let live_svc = cached(&ctx.services, &ns, &svc_name);
    match selector {
        Some(sel) if !sel.is_empty() => {
            let doc = objects::service(server, &sel);
            if apply_owned(ctx, &services, &doc, live_svc.as_deref(), server).await? == Applied::Foreign {
                service_problem = Some((reason::RESOURCE_CONFLICT, foreign("Service", &svc_name)));
            }
        }
        no_pods => {
            if live_svc.as_ref().is_some_and(|s| is_owned_by(&s.metadata, server)) {
                gone(
                    services
                        .delete(&svc_name, &DeleteParams::background())
                        .await
                        .map(|_| ()),
                )?;
                ctx.metrics.write("Service", "delete");
            }
            // The proxy runs, but the Deployment's selector names no labels to select its pods.
            if no_pods.is_some() {
                let message = format!(
                    "the Deployment's selector has no matchLabels, so Service {svc_name} cannot select its pods"
                );
                service_problem = Some((reason::UNSUPPORTED_SELECTOR, message));
            }
        }
    }

    let endpoint = render::endpoint(server);
    let ready = match (conditions.iter().find(|c| c.status != "True"), service_problem) {
        (Some(c), _) => condition(kind::READY, false, &c.reason, c.message.clone(), generation),
        (None, Some((r, m))) => condition(kind::READY, false, r, m, generation),
        (None, None) => {
            let message = format!("serving {served} tools at {endpoint}");
            condition(kind::READY, true, reason::READY, message, generation)
        }
    };
    conditions.insert(0, ready);

    let merged = merge(current.conditions(), conditions, now());
    for c in &merged {
        // A condition True on first sight is how a new server should be: not news (a
        // thousand new servers would otherwise make thousands of Events). Unauthenticated
        // is the exception: True is the warning.
        let changed = match current.condition(&c.type_) {
            None => c.status != "True" || c.type_ == kind::UNAUTHENTICATED,
            Some(o) => o.status != c.status || o.reason != c.reason,
        };
        if changed && c.type_ != kind::READY {
            let t = if c.status == "True" && c.type_ != kind::UNAUTHENTICATED {
                EventType::Normal
            } else {
                EventType::Warning
            };
            publish(ctx, server, t, &c.reason, c.message.clone()).await;
        }
    }
    let valid = rendered.problems.is_empty();
    let desired = McpServerStatus {
        conditions: merged,
        observed_generation: generation,
        // While the settings are invalid the ConfigMap keeps the last valid config: report that.
        tools: if valid { Some(served as i32) } else { current.tools },
        config_hash: if valid {
            Some(rendered.hash.clone())
        } else {
            current.config_hash.clone()
        },
        endpoint: Some(endpoint),
    };
    // Tool verdicts describe the config in the ConfigMap; with invalid server settings that
    // is still the previous one, so the tools keep what they said. They go first: a server
    // that says Ready has reported on each of its tools. A tool whose status cannot be
    // written does not hold back the server's own (it fails the reconcile after it).
    let reported = if valid && config_ok {
        report_tools(ctx, server, &selected, &unselected, &rendered).await
    } else {
        Ok(())
    };
    if current != desired {
        let api: Api<McpServer> = Api::namespaced(client.clone(), &ns);
        api.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": desired })),
        )
        .await?;
        ctx.metrics.write("McpServer", "patch");
        ctx.server_statuses
            .record(key(server), server.metadata.resource_version.as_deref(), desired);
    }
    reported?;
    // A key rotation in progress moves on by the clock, not by a change.
    Ok(requeue.map_or_else(Action::await_change, Action::requeue))
}

/// The McpServer named in the Deployment's `toolgate.dev/server` annotation, when it is
/// another one that still exists.
fn claimed_by_other(ctx: &Context, d: &Deployment, me: &str) -> Option<String> {
    let other = d.annotations().get(SERVER_ANNOTATION).filter(|o| *o != me)?;
    let ns = d.metadata.namespace.as_deref();
    let exists = ctx
        .servers
        .state()
        .iter()
        .any(|s| s.metadata.namespace.as_deref() == ns && s.name_any() == *other);
    exists.then(|| other.clone())
}

/// The condition of a server in the operator's own namespace, which is never a target.
fn protected(ns: &str, type_: &str, generation: Option<i64>) -> Condition {
    let message = format!("namespace {ns} is the operator's own: no McpServer there is served (its ServiceAccount can read Secrets cluster-wide); move the server to the workload's namespace");
    condition(type_, false, reason::PROTECTED_NAMESPACE, message, generation)
}

/// Whether `d` carries the sidecar of McpServer `server`.
fn carries_sidecar_of(d: &Deployment, server: &str) -> bool {
    d.annotations().get(SERVER_ANNOTATION).map(String::as_str) == Some(server) && sidecar_of(d).is_some()
}

fn sidecar_of(d: &Deployment) -> Option<&k8s_openapi::api::core::v1::Container> {
    d.spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .init_containers
        .as_ref()?
        .iter()
        .find(|c| c.name == CONTAINER)
}

/// Whether the live Deployment carries exactly the sidecar and volumes of `patch`.
fn sidecar_matches(d: &Deployment, patch: &Value) -> bool {
    let Some(live) = sidecar_of(d) else { return false };
    let same_hash = d.annotations().get(HASH_ANNOTATION).map(String::as_str) == applied_hash(patch);
    let pod = &patch["spec"]["template"]["spec"];
    let live_pod = d
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .map(|p| serde_json::to_value(p).unwrap_or_default())
        .unwrap_or_default();
    let volumes_match = pod["volumes"].as_array().into_iter().flatten().all(|v| {
        live_pod["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|lv| lv["name"] == v["name"] && is_subset(v, lv))
    });
    same_hash
        && volumes_match
        && is_subset(
            &pod["initContainers"][0],
            &serde_json::to_value(live).unwrap_or_default(),
        )
}

async fn inject_sidecar(
    ctx: &Context,
    server: &McpServer,
    api: &Api<Deployment>,
    d: &Deployment,
    target: &str,
    rendered: &Rendered,
) -> Result<(), Error> {
    let patch = inject::sidecar_patch(server, target, &rendered.mounts, &ctx.defaults);
    if sidecar_matches(d, &patch) {
        return Ok(());
    }
    // The cache may be behind a write of a moment ago: written over the version it shows,
    // or else the API's copy decides.
    if !apply_over(ctx, api, &patch, d.metadata.resource_version.as_deref()).await? {
        ctx.metrics.read("Deployment");
        if api
            .get_opt(target)
            .await?
            .is_some_and(|live| sidecar_matches(&live, &patch))
        {
            return Ok(());
        }
        api.patch(target, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&patch))
            .await?;
        ctx.metrics.write("Deployment", "apply");
    }
    info!(deployment = target, "sidecar applied");
    let note = format!("Applied {CONTAINER} to Deployment {target} as a native sidecar; its pods roll to pick it up");
    publish(ctx, server, EventType::Normal, "SidecarApplied", note).await;
    Ok(())
}

/// Removes this server's sidecar from every Deployment carrying it, except `keep`; `also`
/// is checked even when the Deployment cache does not list it yet.
async fn remove_sidecars(
    ctx: &Context,
    server: &McpServer,
    keep: Option<&str>,
    also: Option<&str>,
) -> Result<(), Error> {
    let ns = server.namespace().unwrap_or_default();
    let name = server.name_any();
    let mut carriers: Vec<String> = ctx
        .deployments
        .state()
        .iter()
        .filter(|d| d.metadata.namespace.as_deref() == Some(&ns))
        .filter(|d| d.annotations().get(SERVER_ANNOTATION) == Some(&name))
        .map(|d| d.name_any())
        .collect();
    carriers.extend(also.map(String::from));
    carriers.sort();
    carriers.dedup();
    let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    for d in carriers.into_iter().filter(|d| Some(d.as_str()) != keep) {
        // The cache may be behind: act on what the API says now.
        ctx.metrics.read("Deployment");
        let Some(live) = api.get_opt(&d).await? else { continue };
        if live.annotations().get(SERVER_ANNOTATION) != Some(&name) {
            continue;
        }
        api.patch(
            &d,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(inject::removal_patch(&ns, &d)),
        )
        .await?;
        ctx.metrics.write("Deployment", "apply");
        remove_leftovers(ctx, &api, &d).await?;
        info!(deployment = %d, "sidecar removed");
        let note = format!("Removed {CONTAINER} from Deployment {d}; it is back to what its owner wrote");
        publish(ctx, server, EventType::Normal, reason::SIDECAR_REMOVED, note).await;
    }
    Ok(())
}

/// Fields another manager also owned (someone ran `kubectl set image` on the sidecar) survive
/// the empty apply; a half sidecar would block the pods, so remove what is left by index,
/// guarded by a `test` of the name.
async fn remove_leftovers(ctx: &Context, api: &Api<Deployment>, name: &str) -> Result<(), Error> {
    ctx.metrics.read("Deployment");
    let Some(d) = api.get_opt(name).await? else {
        return Ok(());
    };
    let Some(pod) = d.spec.as_ref().and_then(|s| s.template.spec.as_ref()) else {
        return Ok(());
    };
    let mut ops = Vec::new();
    for (list, items) in [
        (
            "initContainers",
            pod.init_containers
                .as_ref()
                .map(|c| c.iter().map(|c| c.name.clone()).collect::<Vec<_>>()),
        ),
        (
            "volumes",
            pod.volumes
                .as_ref()
                .map(|v| v.iter().map(|v| v.name.clone()).collect::<Vec<_>>()),
        ),
    ] {
        let items = items.unwrap_or_default();
        for (i, item) in items.iter().enumerate().rev() {
            let ours = if list == "initContainers" {
                item == CONTAINER
            } else {
                inject::VOLUMES.contains(&item.as_str())
            };
            if ours {
                let path = format!("/spec/template/spec/{list}/{i}");
                ops.push(json!({"op": "test", "path": format!("{path}/name"), "value": item}));
                ops.push(json!({"op": "remove", "path": path}));
            }
        }
    }
    if ops.is_empty() {
        return Ok(());
    }
    warn!(
        deployment = name,
        "sidecar fields co-owned by another manager; removing them by JSON patch"
    );
    let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops)).expect("valid JSON patch");
    api.patch(name, &PatchParams::default(), &Patch::<()>::Json(patch))
        .await?;
    ctx.metrics.write("Deployment", "patch");
    Ok(())
}

async fn cleanup(server: &McpServer, ctx: &Context) -> Result<Action, Error> {
    let target = server.spec.workload_ref.as_ref().map(|w| w.name.as_str());
    remove_sidecars(ctx, server, None, target).await?;
    // Owner references let the garbage collector do this too; deleting here makes the
    // cleanup immediate and independent of it. Only what this server owns is deleted.
    let ns = server.namespace().unwrap_or_default();
    let dp = DeleteParams::background();
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
    let cms: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ns);
    let gw = objects::gateway_name(server);
    if cached(&ctx.deployments, &ns, &gw).is_some_and(|m| is_owned_by(&m.metadata, server)) {
        gone(deployments.delete(&gw, &dp).await.map(|_| ()))?;
    }
    let svc = service_name(server);
    if cached_or_read(ctx, &ctx.services, &ns, &svc)
        .await?
        .is_some_and(|m| is_owned_by(&m.metadata, server))
    {
        gone(services.delete(&svc, &dp).await.map(|_| ()))?;
    }
    let cm = configmap_name(server);
    if cached_or_read(ctx, &ctx.configmaps, &ns, &cm)
        .await?
        .is_some_and(|m| is_owned_by(&m.metadata, server))
    {
        gone(cms.delete(&cm, &dp).await.map(|_| ()))?;
    }
    ctx.served.record(&ns, &server.name_any(), Vec::new());
    info!("cleaned up");
    Ok(Action::await_change())
}

fn gone(r: Result<(), kube::Error>) -> Result<(), Error> {
    match r {
        Ok(()) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Writes each tool's `Accepted` condition where it changed, and records which tools this
/// server rendered (a tool moving away then reconciles this server too).
async fn report_tools(
    ctx: &Context,
    server: &McpServer,
    selected: &[McpTool],
    unselected: &[McpTool],
    rendered: &Rendered,
) -> Result<(), Error> {
    let name = server.name_any();
    let ns = server.namespace().unwrap_or_default();
    ctx.served
        .record(&ns, &name, selected.iter().map(ResourceExt::name_any).collect());
    let verdicts = selected
        .iter()
        .map(|t| (t, rendered.verdicts.get(&t.name_any()).cloned()))
        .chain(unselected.iter().map(|t| {
            let v = Verdict::Rejected {
                tier: None,
                reason: reason::NOT_SELECTED,
                message: format!("its labels do not match McpServer {name}'s toolSelector"),
            };
            (t, Some(v))
        }));
    let writes = verdicts.filter_map(|(tool, verdict)| {
        let verdict = verdict?;
        let generation = tool.metadata.generation;
        let (cond, tier) = match &verdict {
            Verdict::Accepted { tier } => {
                let msg = format!("served by McpServer {name} as `{}`", tool.tool_name());
                (
                    condition(kind::ACCEPTED, true, reason::ACCEPTED, msg, generation),
                    Some(*tier),
                )
            }
            Verdict::Rejected { tier, reason, message } => (
                condition(kind::ACCEPTED, false, reason, message.clone(), generation),
                *tier,
            ),
        };
        Some((tool, cond, tier))
    });
    // A few at a time: a server with 1,000 new tools reports in seconds, not minutes. Every
    // write runs to its end (one failing stops no other, so none lands unrecorded); the
    // first failure is the result.
    let failures = Mutex::new(Vec::new());
    let failed = &failures;
    futures::stream::iter(writes)
        .for_each_concurrent(TOOL_STATUS_WRITES, |(tool, cond, tier)| async move {
            if let Err(e) = set_tool_status(ctx, tool, cond, tier).await {
                failed.lock().expect("lock").push(e);
            }
        })
        .await;
    match failures.into_inner().expect("lock").into_iter().next() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Sets `cond` (and `tier`) on `tool` unless it already says so; a changed condition is an Event.
pub(super) async fn set_tool_status(
    ctx: &Context,
    tool: &McpTool,
    cond: Condition,
    tier: Option<toolgate_config::Tier>,
) -> Result<(), Error> {
    let k = key(tool);
    let current = ctx
        .tool_statuses
        .current(&k, tool.metadata.resource_version.as_deref(), tool.status.clone())
        .unwrap_or_default();
    // Events for rejections, and for a rejected tool becoming accepted; a tool accepted on
    // first sight is not news (one Event per tool would flood a namespace with many tools).
    let changed = match current.condition(&cond.type_) {
        None => cond.status != "True",
        Some(o) => o.status != cond.status || o.reason != cond.reason,
    };
    let event = (cond.status.clone(), cond.reason.clone(), cond.message.clone());
    let desired = McpToolStatus {
        conditions: merge(current.conditions(), vec![cond], now()),
        observed_generation: tool.metadata.generation,
        tier,
    };
    if current == desired {
        return Ok(());
    }
    let api: Api<McpTool> = Api::namespaced(ctx.client.clone(), &tool.namespace().unwrap_or_default());
    // `tier` is written even when None, so a merge patch clears a stale one.
    let mut body = json!({ "status": desired });
    body["status"]["tier"] = json!(desired.tier);
    match api
        .patch_status(&tool.name_any(), &PatchParams::default(), &Patch::Merge(body))
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    ctx.metrics.write("McpTool", "patch");
    ctx.tool_statuses
        .record(k, tool.metadata.resource_version.as_deref(), desired);
    if changed {
        let t = if event.0 == "True" {
            EventType::Normal
        } else {
            EventType::Warning
        };
        publish(ctx, tool, t, &event.1, event.2).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::is_subset;
    use serde_json::json;

    #[test]
    fn subset_ignores_added_fields_but_not_changed_or_missing_ones() {
        let doc = json!({"a": 1, "l": [{"n": "x"}], "m": {"k": "v"}});
        assert!(is_subset(
            &doc,
            &json!({"a": 1, "b": 2, "l": [{"n": "x", "d": 0}], "m": {"k": "v", "z": 1}})
        ));
        assert!(!is_subset(&doc, &json!({"a": 2, "l": [{"n": "x"}], "m": {"k": "v"}})));
        assert!(!is_subset(
            &doc,
            &json!({"a": 1, "l": [{"n": "x"}, {"n": "y"}], "m": {"k": "v"}})
        ));
        assert!(!is_subset(&doc, &json!({"a": 1, "l": [{"n": "x"}]})));
        assert!(
            is_subset(&json!({"env": [], "m": {}}), &json!({})),
            "empty lists and maps are dropped by the API server"
        );
    }
}
