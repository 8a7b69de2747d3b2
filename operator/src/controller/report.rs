//! Reporting on tools: each McpTool's `Accepted` condition (and tier), as the server that
//! renders it decided, written only where it changed.

use std::sync::Mutex;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use serde_json::json;

use super::server::{now, publish};
use super::{key, Context, Error};
use crate::crd::{HasConditions, McpServer, McpTool, McpToolStatus};
use crate::render::{Rendered, Verdict};
use crate::status::{condition, kind, merge, reason};

/// Tool status writes in flight per server reconcile.
const TOOL_STATUS_WRITES: usize = 8;

/// Writes each tool's `Accepted` condition where it changed, and records which tools this
/// server rendered (a tool moving away then reconciles this server too).
pub(super) async fn report_tools(
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
