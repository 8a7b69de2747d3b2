//! McpTool reconcile: only for tools whose server does not exist (the server's reconcile
//! reports on every other tool).

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::runtime::controller::Action;
use kube::ResourceExt;
use tracing::{instrument, warn};

use super::report::set_tool_status;
use super::{key, observe, Context, Error};
use crate::crd::{HasConditions, McpTool};
use crate::status::{condition, kind, reason};

/// How long a tool waits for its server before it reports `ServerNotFound`:
/// `kubectl apply -f dir/` sends a server's tools in name order, often before the server,
/// and a condition and Event per tool that are gone a second later help nobody.
pub(super) const SERVER_GRACE: Duration = Duration::from_secs(5);

#[instrument(skip_all, fields(tool = %key(&*tool)))]
pub(super) async fn reconcile(tool: Arc<McpTool>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    // With the server cache complete, a tool whose server exists costs no API read (a
    // restart over 1,000 tools would otherwise send 1,000 reads at once).
    ctx.caches_ready().await;
    let result = check(&tool, &ctx).await;
    observe(&ctx, "mcptool", started, &result);
    if result.is_ok() {
        ctx.reset(&key(&*tool));
    }
    result
}

async fn check(tool: &McpTool, ctx: &Context) -> Result<Action, Error> {
    let ns = tool.namespace().unwrap_or_default();
    let server = &tool.spec.server_ref.name;
    let k = key(tool);
    if super::cached(&ctx.servers, &ns, server).is_some() {
        ctx.missing_servers.lock().expect("lock").remove(&k);
        return Ok(Action::await_change());
    }
    // Already reported for this generation: nothing to write, so nothing to read (the
    // server appearing reconciles the tool again).
    let reported = ctx
        .tool_statuses
        .current(&k, tool.metadata.resource_version.as_deref(), tool.status.clone())
        .is_some_and(|s| {
            s.condition(kind::ACCEPTED).is_some_and(|c| {
                c.reason == reason::SERVER_NOT_FOUND && c.observed_generation == tool.metadata.generation
            })
        });
    if reported {
        return Ok(Action::await_change());
    }
    let first = *ctx
        .missing_servers
        .lock()
        .expect("lock")
        .entry(k.clone())
        .or_insert_with(Instant::now);
    if let Some(left) = SERVER_GRACE.checked_sub(first.elapsed()) {
        return Ok(Action::requeue(left));
    }
    // A miss is confirmed in the API: the server cache is another watch than the one that
    // may have started this reconcile.
    let missing = super::cached_or_read(ctx, &ctx.servers, &ns, server).await?.is_none();
    ctx.missing_servers.lock().expect("lock").remove(&k);
    if missing {
        let message = format!("McpServer {server} not found in namespace {ns}; create it or fix spec.serverRef.name");
        let cond = condition(
            kind::ACCEPTED,
            false,
            reason::SERVER_NOT_FOUND,
            message,
            tool.metadata.generation,
        );
        set_tool_status(ctx, tool, cond, None).await?;
    }
    Ok(Action::await_change())
}

pub(super) fn error_policy(tool: Arc<McpTool>, err: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx.backoff(key(&*tool));
    warn!(tool = %key(&*tool), error = %err, retry_in_ms = delay.as_millis() as u64, "reconcile failed");
    Action::requeue(delay)
}
