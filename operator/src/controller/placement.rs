//! Where the proxy runs: as a native sidecar of the server's workload, or as a gateway
//! Deployment in front of its Service; and taking a sidecar out again. A workload or Service
//! is only fronted once its owner opted in.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use serde_json::{json, Value};
use tracing::{info, warn};

use super::owned::{apply_over, apply_owned, foreign, is_owned_by, is_subset, Applied};
use super::server::publish;
use super::{cached, Context, Error, MANAGER};
use crate::crd::McpServer;
use crate::inject::{self, applied_hash, CONTAINER, HASH_ANNOTATION, SERVER_ANNOTATION};
use crate::objects;
use crate::render::Rendered;
use crate::status::{condition, kind, reason};

/// The labels of the pods the proxy runs in, for the Service to select; `None` while no
/// proxy runs.
pub(super) type Pods = Option<BTreeMap<String, String>>;

/// What keeps the proxy from running, found before it is placed.
pub(super) struct Blockers<'a> {
    pub ctx: &'a Context,
    pub ns: &'a str,
    pub generation: Option<i64>,
    /// The session-key Secret exists and is not the operator's.
    pub key_problem: Option<String>,
    /// Referenced Secrets the proxy may not mount.
    pub refused: Vec<String>,
    /// Referenced Secrets that do not exist (yet).
    pub missing: Vec<String>,
    /// The proxy image the server asks for.
    pub image: &'a str,
    /// The ConfigMap holds a valid config.
    pub config_ok: bool,
}

impl Blockers<'_> {
    /// Why the proxy may not run, as condition `type_` (first reason wins); `true`: what runs
    /// must go too (the owner of a target withdrew, or never gave, consent), `false`: what
    /// runs is kept until fixed.
    pub(super) fn first(&self, type_: &str) -> Option<(Condition, bool)> {
        let c = |r: &str, m: String| condition(type_, false, r, m, self.generation);
        if self.ctx.guard.protects(self.ns) {
            Some((protected(self.ns, type_, self.generation), true))
        } else if let Some(message) = &self.key_problem {
            // Not the operator's key: nothing may mount it.
            Some((c(reason::RESOURCE_CONFLICT, message.clone()), true))
        } else if !self.refused.is_empty() {
            let message = format!(
                    "Secret {} may not be mounted into the proxy: whoever may write it labels it {}={} (or the operator runs with --trust-namespace-secrets)",
                    self.refused.join(", "),
                    crate::guard::SECRET_USAGE_LABEL,
                    crate::guard::SECRET_USAGE_PROXY
                );
            Some((c(reason::SECRET_NOT_ALLOWED, message), true))
        } else if !self.ctx.guard.image_allowed(self.image, &self.ctx.defaults.image) {
            let allowed = if self.ctx.guard.allowed_images.is_empty() {
                crate::guard::repository(&self.ctx.defaults.image).to_string()
            } else {
                self.ctx.guard.allowed_images.join(", ")
            };
            let message = format!("spec.image {} is not an allowed proxy image (allowed: {allowed}, any tag or digest); nothing was changed; the cluster administrator sets --allowed-proxy-images", self.image);
            Some((c(reason::IMAGE_NOT_ALLOWED, message), false))
        } else if !self.missing.is_empty() {
            let message = format!(
                "Secret {} not found in namespace {}; the proxy is started once it exists",
                self.missing.join(", "),
                self.ns
            );
            Some((c(reason::SECRET_NOT_FOUND, message), false))
        } else if !self.config_ok {
            let message = "no valid config has been rendered yet (see ConfigRendered)".to_string();
            Some((c(reason::INVALID_SERVER_CONFIG, message), false))
        } else {
            None
        }
    }
}

/// Runs the proxy as a native sidecar of `spec.workloadRef` (and takes it out of any other
/// Deployment, and the gateway down): the `SidecarInjected` condition and the proxy's pods.
pub(super) async fn sidecar(
    ctx: &Context,
    server: &McpServer,
    rendered: &Rendered,
    blockers: &Blockers<'_>,
) -> Result<(Condition, Pods), Error> {
    let ns = server.namespace().unwrap_or_default();
    let name = server.name_any();
    let generation = server.metadata.generation;
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    let gateway_name = objects::gateway_name(server);
    let mut selector = None;
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
            let message =
                format!("Deployment {target} not found in namespace {ns}; create it or fix spec.workloadRef.name");
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
                match blockers.first(kind::SIDECAR_INJECTED) {
                    Some((c, revoke)) => {
                        if revoke {
                            remove_sidecars(ctx, server, None, Some(&target)).await?;
                        } else if carries_sidecar_of(&d, &name) {
                            selector = Some(pods.unwrap_or_default());
                        }
                        c
                    }
                    None => {
                        inject_sidecar(ctx, server, &deployments, &d, &target, rendered).await?;
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
    Ok((cond, selector))
}

/// Runs the proxy as a gateway Deployment in front of `spec.upstream.service` (and takes
/// any sidecar out): the `GatewayAvailable` condition and the gateway's pods.
pub(super) async fn gateway(
    ctx: &Context,
    server: &McpServer,
    rendered: &Rendered,
    blockers: &Blockers<'_>,
) -> Result<(Condition, Pods), Error> {
    let ns = server.namespace().unwrap_or_default();
    let name = server.name_any();
    let generation = server.metadata.generation;
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    let gateway_name = objects::gateway_name(server);
    let mut selector = None;
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
    let cond = match refused.or_else(|| blockers.first(kind::GATEWAY_AVAILABLE)) {
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
            let doc = objects::gateway(server, rendered, &ctx.defaults);
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
    Ok((cond, selector))
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
pub(super) async fn remove_sidecars(
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
