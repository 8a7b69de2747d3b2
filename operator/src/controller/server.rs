//! McpServer reconcile: render, apply the ConfigMap, inject the sidecar (or run the
//! gateway), expose the Service, and report on the server and each of its tools. Every
//! write is skipped when the live object already holds what would be written, and objects
//! the server does not own are never taken over.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::core::{Selector, SelectorExt};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event as KubeEvent, EventType};
use kube::runtime::finalizer::{finalizer, Error as FinalizerError, Event};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tracing::{info, instrument, warn};

use super::owned::{apply_owned, foreign, gone, is_owned_by, Applied};
use super::placement::{self, remove_sidecars, Blockers};
use super::report::report_tools;
use super::{cached, cached_or_read, key, observe, Context, Error, FINALIZER};
use crate::crd::{HasConditions, McpServer, McpServerStatus, McpTool, ServerMode, ServerSessions};
use crate::objects;
use crate::render::{self, configmap_name, render, service_name};
use crate::status::{condition, kind, merge, reason};

/// Event notes are capped at 1024 bytes by the API.
const NOTE_LIMIT: usize = 1000;

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

pub(super) fn now() -> Time {
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

    let blockers = Blockers {
        ctx,
        ns: &ns,
        generation,
        key_problem,
        refused,
        missing,
        image,
        config_ok,
    };
    // The pods the Service selects, once the proxy runs in them.
    let (placed, selector) = match server.spec.mode {
        ServerMode::Sidecar => placement::sidecar(ctx, server, &rendered, &blockers).await?,
        ServerMode::Gateway => placement::gateway(ctx, server, &rendered, &blockers).await?,
    };
    conditions.push(placed);

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
