//! McpServer reconcile: render, apply the ConfigMap, inject the sidecar (or run the
//! gateway), expose the Service, and report on the server and each of its tools. Every
//! write is skipped when the object already holds what would be written.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::core::{Selector, SelectorExt};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event as KubeEvent, EventType};
use kube::runtime::finalizer::{finalizer, Error as FinalizerError, Event};
use kube::{Api, Resource, ResourceExt};
use serde_json::{json, Value};
use tracing::{info, instrument, warn};

use super::{key, observe, Context, Error, FINALIZER, MANAGER};
use crate::crd::{HasConditions, McpServer, McpServerStatus, McpTool, McpToolStatus, ServerMode};
use crate::inject::{self, applied_hash, CONTAINER, HASH_ANNOTATION, SERVER_ANNOTATION};
use crate::objects;
use crate::render::{self, configmap_name, render, service_name, Rendered, Verdict};
use crate::status::{condition, kind, merge, reason};

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
    names
}

#[instrument(skip_all, fields(server = %key(&*server)))]
pub(super) async fn reconcile(server: Arc<McpServer>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let k = key(&*server);
    let api: Api<McpServer> = Api::namespaced(ctx.client.clone(), &server.namespace().unwrap_or_default());
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
    observe(&ctx, "mcpserver", started, &result);
    if result.is_ok() {
        ctx.reset(&k);
    }
    result
}

pub(super) fn error_policy(server: Arc<McpServer>, err: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx.backoff(key(&*server));
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
    ctx.tools
        .state()
        .iter()
        .filter(|t| t.metadata.namespace.as_deref() == ns && t.spec.server_ref.name == name)
        .filter(|t| t.metadata.deletion_timestamp.is_none())
        .map(|t| (**t).clone())
        .partition(|t| selector.as_ref().is_none_or(|s| s.matches(t.labels())))
}

async fn apply_doc<K>(
    ctx: &Context,
    api: &Api<K>,
    name: &str,
    doc: &Value,
    current: Option<&BTreeMap<String, String>>,
    kind: &'static str,
) -> Result<bool, Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    if current.and_then(|a| a.get(HASH_ANNOTATION)).map(String::as_str) == applied_hash(doc) {
        return Ok(false);
    }
    api.patch(name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(doc))
        .await?;
    ctx.metrics.write(kind, "apply");
    Ok(true)
}

async fn publish(
    ctx: &Context,
    object: &impl Resource<DynamicType = ()>,
    type_: EventType,
    reason: &str,
    note: String,
) {
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

    let mut missing = Vec::new();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    for m in &rendered.mounts {
        if !missing.contains(&m.secret) && secrets.get_metadata_opt(&m.secret).await?.is_none() {
            missing.push(m.secret.clone());
        }
    }

    let mut conditions = Vec::new();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let cm_name = configmap_name(server);
    let existing_cm = cms.get_metadata_opt(&cm_name).await?;
    let config_ok = if rendered.problems.is_empty() {
        let doc = objects::configmap(server, &rendered);
        if apply_doc(
            ctx,
            &cms,
            &cm_name,
            &doc,
            existing_cm.as_ref().map(|m| m.annotations()),
            "ConfigMap",
        )
        .await?
        {
            info!(tools = served, hash = %rendered.hash, "config applied");
            let note = format!(
                "Rendered {served} tools into ConfigMap {cm_name} (hash {})",
                &rendered.hash[..12]
            );
            publish(ctx, server, EventType::Normal, reason::CONFIG_APPLIED, note).await;
        }
        conditions.push(condition(
            kind::CONFIG_RENDERED,
            true,
            reason::CONFIG_APPLIED,
            format!("{served} tools in ConfigMap {cm_name}"),
            generation,
        ));
        true
    } else {
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
        existing_cm.is_some()
    };

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let gateway_name = objects::gateway_name(server);
    let mut selector = None;
    let blocked = |what: &str| -> Option<Condition> {
        let type_ = what;
        if !missing.is_empty() {
            let message = format!(
                "Secret {} not found in namespace {ns}; the proxy is started once it exists",
                missing.join(", ")
            );
            Some(condition(type_, false, reason::SECRET_NOT_FOUND, message, generation))
        } else if !config_ok {
            Some(condition(
                type_,
                false,
                reason::INVALID_SERVER_CONFIG,
                "no valid config has been rendered yet (see ConfigRendered)",
                generation,
            ))
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
            remove_sidecars(ctx, server, Some(&target)).await?;
            if deployments
                .get_metadata_opt(&gateway_name)
                .await?
                .is_some_and(|d| is_owned_by(&d.metadata, server))
            {
                deployments.delete(&gateway_name, &DeleteParams::background()).await?;
                ctx.metrics.write("Deployment", "delete");
            }
            let cond = match deployments.get_opt(&target).await? {
                None => condition(
                    kind::SIDECAR_INJECTED,
                    false,
                    reason::WORKLOAD_NOT_FOUND,
                    format!("Deployment {target} not found in namespace {ns}; create it or fix spec.workloadRef.name"),
                    generation,
                ),
                Some(d) => match d.annotations().get(SERVER_ANNOTATION).filter(|o| **o != name) {
                    Some(other) => condition(
                        kind::SIDECAR_INJECTED,
                        false,
                        reason::WORKLOAD_IN_USE,
                        format!("Deployment {target} already carries the sidecar of McpServer {other}; a Deployment serves one McpServer"),
                        generation,
                    ),
                    None => {
                        selector = d.spec.as_ref().and_then(|s| s.selector.match_labels.clone());
                        match blocked(kind::SIDECAR_INJECTED) {
                            Some(c) => c,
                            None => {
                                inject_sidecar(ctx, server, &deployments, &d, &target, &rendered).await?;
                                condition(
                                    kind::SIDECAR_INJECTED,
                                    true,
                                    reason::SIDECAR_INJECTED,
                                    format!("Deployment {target} runs {CONTAINER} as a native sidecar"),
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
            remove_sidecars(ctx, server, None).await?;
            selector = Some(objects::gateway_selector(server));
            let cond = match blocked(kind::GATEWAY_AVAILABLE) {
                Some(c) => c,
                None => {
                    let doc = objects::gateway(server, &rendered, &ctx.defaults);
                    let current = deployments.get_opt(&gateway_name).await?;
                    apply_doc(
                        ctx,
                        &deployments,
                        &gateway_name,
                        &doc,
                        current.as_ref().map(|d| d.annotations()),
                        "Deployment",
                    )
                    .await?;
                    let status = current.and_then(|d| d.status).unwrap_or_default();
                    let available = status.available_replicas.unwrap_or(0);
                    let want = server.spec.replicas.unwrap_or(2);
                    if available > 0 {
                        condition(
                            kind::GATEWAY_AVAILABLE,
                            true,
                            reason::GATEWAY_AVAILABLE,
                            format!("{available}/{want} gateway replicas available"),
                            generation,
                        )
                    } else {
                        condition(
                            kind::GATEWAY_AVAILABLE,
                            false,
                            reason::GATEWAY_PROGRESSING,
                            format!("0/{want} replicas of Deployment {gateway_name} available yet"),
                            generation,
                        )
                    }
                }
            };
            conditions.push(cond);
        }
    }

    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let svc_name = service_name(server);
    let mut selector_problem = None;
    match selector.filter(|s| !s.is_empty()) {
        Some(sel) => {
            let doc = objects::service(server, &sel);
            let current = services.get_metadata_opt(&svc_name).await?;
            apply_doc(
                ctx,
                &services,
                &svc_name,
                &doc,
                current.as_ref().map(|m| m.annotations()),
                "Service",
            )
            .await?;
        }
        None if server.spec.mode == ServerMode::Sidecar && conditions.last().is_some_and(|c| c.status == "True") => {
            selector_problem = Some(
                "the Deployment's selector has no matchLabels, so Service {svc_name} cannot select its pods"
                    .replace("{svc_name}", &svc_name),
            );
        }
        None => {}
    }

    let endpoint = render::endpoint(server);
    let ready = match (conditions.iter().find(|c| c.status != "True"), selector_problem) {
        (Some(c), _) => condition(kind::READY, false, &c.reason, c.message.clone(), generation),
        (None, Some(p)) => condition(kind::READY, false, reason::UNSUPPORTED_SELECTOR, p, generation),
        (None, None) => condition(
            kind::READY,
            true,
            reason::READY,
            format!("serving {served} tools at {endpoint}"),
            generation,
        ),
    };
    conditions.insert(0, ready);

    let current = server.status.clone().unwrap_or_default();
    let merged = merge(current.conditions(), conditions, now());
    for c in &merged {
        let changed = current
            .condition(&c.type_)
            .is_none_or(|o| o.status != c.status || o.reason != c.reason);
        if changed && c.type_ != kind::READY {
            let t = if c.status == "True" {
                EventType::Normal
            } else {
                EventType::Warning
            };
            publish(ctx, server, t, &c.reason, c.message.clone()).await;
        }
    }
    let desired = McpServerStatus {
        conditions: merged,
        observed_generation: generation,
        tools: Some(served as i32),
        config_hash: if rendered.problems.is_empty() {
            Some(rendered.hash.clone())
        } else {
            current.config_hash.clone()
        },
        endpoint: Some(endpoint),
    };
    if server.status.as_ref() != Some(&desired) {
        let api: Api<McpServer> = Api::namespaced(client.clone(), &ns);
        api.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": desired})),
        )
        .await?;
        ctx.metrics.write("McpServer", "patch");
    }

    report_tools(ctx, server, &selected, &unselected, &rendered).await?;
    Ok(Action::await_change())
}

fn is_owned_by(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta, server: &McpServer) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "McpServer" && Some(&o.uid) == server.metadata.uid.as_ref())
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
    let present = d
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.init_containers.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.name == CONTAINER));
    let same = d.annotations().get(HASH_ANNOTATION).map(String::as_str) == applied_hash(&patch);
    if present && same {
        return Ok(());
    }
    api.patch(target, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&patch))
        .await?;
    ctx.metrics.write("Deployment", "apply");
    info!(deployment = target, "sidecar applied");
    let note = format!("Applied {CONTAINER} to Deployment {target} as a native sidecar; its pods roll to pick it up");
    publish(ctx, server, EventType::Normal, "SidecarApplied", note).await;
    Ok(())
}

/// Removes this server's sidecar from every Deployment carrying it, except `keep`.
async fn remove_sidecars(ctx: &Context, server: &McpServer, keep: Option<&str>) -> Result<(), Error> {
    let ns = server.namespace().unwrap_or_default();
    let name = server.name_any();
    let carriers: Vec<String> = ctx
        .deployments
        .state()
        .iter()
        .filter(|d| d.metadata.namespace.as_deref() == Some(&ns))
        .filter(|d| d.annotations().get(SERVER_ANNOTATION) == Some(&name))
        .map(|d| d.name_any())
        .filter(|d| Some(d.as_str()) != keep)
        .collect();
    let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    for d in carriers {
        match api
            .patch(
                &d,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(inject::removal_patch(&ns, &d)),
            )
            .await
        {
            Ok(_) => {
                ctx.metrics.write("Deployment", "apply");
                info!(deployment = %d, "sidecar removed");
                let note = format!("Removed {CONTAINER} from Deployment {d}; it is back to what its owner wrote");
                publish(ctx, server, EventType::Normal, reason::SIDECAR_REMOVED, note).await;
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

async fn cleanup(server: &McpServer, ctx: &Context) -> Result<Action, Error> {
    remove_sidecars(ctx, server, None).await?;
    // Owner references let the garbage collector do this too; deleting here makes the
    // cleanup immediate and independent of it.
    let ns = server.namespace().unwrap_or_default();
    let gone = |r: Result<_, kube::Error>| match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(Error::from(e)),
    };
    let dp = DeleteParams::background();
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    if deployments
        .get_metadata_opt(&objects::gateway_name(server))
        .await?
        .is_some_and(|d| is_owned_by(&d.metadata, server))
    {
        gone(
            deployments
                .delete(&objects::gateway_name(server), &dp)
                .await
                .map(|_| ()),
        )?;
    }
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
    gone(services.delete(&service_name(server), &dp).await.map(|_| ()))?;
    let cms: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ns);
    gone(cms.delete(&configmap_name(server), &dp).await.map(|_| ()))?;
    ctx.metrics.write("McpServer", "cleanup");
    info!("cleaned up");
    Ok(Action::await_change())
}

/// Writes each tool's `Accepted` condition where it changed.
async fn report_tools(
    ctx: &Context,
    server: &McpServer,
    selected: &[McpTool],
    unselected: &[McpTool],
    rendered: &Rendered,
) -> Result<(), Error> {
    let name = server.name_any();
    let mut accepted = 0;
    let mut rejected = 0;
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
    for (tool, verdict) in verdicts {
        let Some(verdict) = verdict else { continue };
        let generation = tool.metadata.generation;
        let (cond, tier) = match &verdict {
            Verdict::Accepted { tier } => {
                accepted += 1;
                let msg = format!("served by McpServer {name} as `{}`", tool.tool_name());
                (
                    condition(kind::ACCEPTED, true, reason::ACCEPTED, msg, generation),
                    Some(*tier),
                )
            }
            Verdict::Rejected { tier, reason, message } => {
                rejected += 1;
                (
                    condition(kind::ACCEPTED, false, reason, message.clone(), generation),
                    *tier,
                )
            }
        };
        set_tool_status(ctx, tool, cond, tier).await?;
    }
    ctx.metrics.tools.with_label_values(&["true"]).set(accepted);
    ctx.metrics.tools.with_label_values(&["false"]).set(rejected);
    Ok(())
}

/// Sets `cond` (and `tier`) on `tool` unless it already says so; a changed condition is an Event.
pub(super) async fn set_tool_status(
    ctx: &Context,
    tool: &McpTool,
    cond: Condition,
    tier: Option<toolgate_config::Tier>,
) -> Result<(), Error> {
    let current = tool.status.clone().unwrap_or_default();
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
