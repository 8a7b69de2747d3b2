//! Whether one `tools/call` may go on as far as limits and sessions go: counted in the shared
//! store when there is one (every replica then shares one budget), on this replica otherwise,
//! and on this replica too while the store cannot answer under `failOpen`.

use std::time::Duration;

use toolgate_config::{FailurePolicy, Tier};

use super::session::Session;
use super::Shared;
use crate::metrics::METRICS;
use crate::policy::Identity;
use crate::runtime::{CompiledTool, Runtime};
use crate::store::Admission;

/// The verdict on one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Counted; go on.
    Admitted,
    /// Over the limit of this scope (`identity`, `tool`); retry after.
    Limited(&'static str, Duration),
    /// Its sealed session was ended on another replica.
    Revoked,
    /// The store cannot answer and `failClosed` refuses this write-tier call.
    Unavailable,
}

/// Counts the call of `tool` by `who` in `session`.
pub(crate) async fn admit(
    shared: &Shared,
    rt: &Runtime,
    who: &Identity,
    tool: &CompiledTool,
    session: Option<&Session>,
) -> Verdict {
    let name = tool.config.name.as_str();
    let per_tool = rt.limits.per_tool.get(name).copied();
    if let Some(store) = shared.store.load_full() {
        let subject = who.subject_digest();
        let handle = session.filter(|s| s.expires.is_some()).map(|s| &*s.handle);
        match store
            .admit(&subject, rt.limits.per_identity, per_tool.map(|r| (name, r)), handle)
            .await
        {
            Ok(Admission::Admitted) => return Verdict::Admitted,
            Ok(Admission::Limited(scope, retry)) => return Verdict::Limited(scope, retry),
            Ok(Admission::Revoked) => return Verdict::Revoked,
            Err(_) if store.failure_policy() == FailurePolicy::FailClosed && tool.tier == Tier::Write => {
                METRICS.store_fallbacks.with_label_values(&["refused"]).inc();
                return Verdict::Unavailable;
            }
            Err(_) => METRICS.store_fallbacks.with_label_values(&["local"]).inc(),
        }
    }
    if let Err(retry) = shared.limiters.identity.check(&who.subject, rt.limits.per_identity) {
        return Verdict::Limited("identity", retry);
    }
    if let Some(rate) = per_tool {
        let key = format!("{}\u{0}{name}", who.subject);
        if let Err(retry) = shared.limiters.tool.check(&key, rate) {
            return Verdict::Limited("tool", retry);
        }
    }
    Verdict::Admitted
}

/// Whether the sealed `session` was ended: here, or (asking the shared store) on another
/// replica. While the store cannot answer the session is accepted, and counted as unchecked:
/// refusing every session of every client would turn a store outage into an MCP outage.
pub(crate) async fn session_revoked(shared: &Shared, session: &Session) -> bool {
    if session.expires.is_none() {
        return false;
    }
    if shared.revoked.contains(session) {
        return true;
    }
    let Some(store) = shared.store.load_full() else {
        return false;
    };
    match store.is_revoked(&session.subject, &session.handle).await {
        Ok(revoked) => revoked,
        Err(_) => {
            METRICS.store_fallbacks.with_label_values(&["unchecked"]).inc();
            false
        }
    }
}
