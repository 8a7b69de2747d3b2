//! Condition types, reasons (CamelCase constants) and the merge that keeps
//! `lastTransitionTime` when a condition's status did not change.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Condition types.
pub mod kind {
    /// Summary: the endpoint serves the rendered config.
    pub const READY: &str = "Ready";
    /// The ConfigMap holds the current ProxyConfig.
    pub const CONFIG_RENDERED: &str = "ConfigRendered";
    /// Sidecar mode: the Deployment's pod template has the proxy.
    pub const SIDECAR_INJECTED: &str = "SidecarInjected";
    /// Gateway mode: the gateway Deployment has available replicas.
    pub const GATEWAY_AVAILABLE: &str = "GatewayAvailable";
    /// McpTool: the tool is in its server's config.
    pub const ACCEPTED: &str = "Accepted";
    /// A warning, present (True) only while the server serves callers without authentication
    /// (`auth.mode: none`); it does not make the server un-Ready.
    pub const UNAUTHENTICATED: &str = "Unauthenticated";
}

/// Reasons, used in conditions, Events and metric labels.
pub mod reason {
    /// The tool is served.
    pub const ACCEPTED: &str = "Accepted";
    /// inputSchema or outputSchema is not a usable JSON Schema.
    pub const INVALID_SCHEMA: &str = "InvalidSchema";
    /// Another (older) tool of the server has the same MCP name.
    pub const NAME_CONFLICT: &str = "NameConflict";
    /// `serverRef` names no McpServer.
    pub const SERVER_NOT_FOUND: &str = "ServerNotFound";
    /// The http mapping or response shaping does not fit the schema.
    pub const INVALID_MAPPING: &str = "InvalidMapping";
    /// `requiredRole` is not one of the server's roles.
    pub const UNKNOWN_ROLE: &str = "UnknownRole";
    /// A write tool on a read-only server.
    pub const READ_ONLY_SERVER: &str = "ReadOnlyServer";
    /// The tool's server selects it by label, but its serverRef names another server.
    pub const NOT_SELECTED: &str = "NotSelected";
    /// The ConfigMap was written.
    pub const CONFIG_APPLIED: &str = "ConfigApplied";
    /// A session-key rotation moved to its next step (Event).
    pub const SESSION_KEY_ROTATED: &str = "SessionKeyRotated";
    /// The server's own settings do not make a valid ProxyConfig.
    pub const INVALID_SERVER_CONFIG: &str = "InvalidServerConfig";
    /// The rendered config is larger than a ConfigMap can hold.
    pub const CONFIG_TOO_LARGE: &str = "ConfigTooLarge";
    /// The Deployment has the sidecar.
    pub const SIDECAR_INJECTED: &str = "SidecarInjected";
    /// The Deployment in workloadRef does not exist.
    pub const WORKLOAD_NOT_FOUND: &str = "WorkloadNotFound";
    /// Another McpServer already injects into the Deployment.
    pub const WORKLOAD_IN_USE: &str = "WorkloadInUse";
    /// The Deployment's selector cannot be used for the Service.
    pub const UNSUPPORTED_SELECTOR: &str = "UnsupportedSelector";
    /// A referenced Secret does not exist.
    pub const SECRET_NOT_FOUND: &str = "SecretNotFound";
    /// The gateway Deployment has available replicas.
    pub const GATEWAY_AVAILABLE: &str = "GatewayAvailable";
    /// The gateway Deployment has no available replica yet.
    pub const GATEWAY_PROGRESSING: &str = "GatewayProgressing";
    /// Everything is in place.
    pub const READY: &str = "Ready";
    /// Removed from the workload on deletion.
    pub const SIDECAR_REMOVED: &str = "SidecarRemoved";
    /// An object of the name the operator needs exists and belongs to someone else.
    pub const RESOURCE_CONFLICT: &str = "ResourceConflict";
    /// The Deployment does not carry the opt-in annotation naming this server.
    pub const WORKLOAD_NOT_OPTED_IN: &str = "WorkloadNotOptedIn";
    /// `spec.image` is not in the operator's allowlist.
    pub const IMAGE_NOT_ALLOWED: &str = "ImageNotAllowed";
    /// A referenced Secret does not carry the label that allows mounting it.
    pub const SECRET_NOT_ALLOWED: &str = "SecretNotAllowed";
    /// The server is in the operator's own namespace, which is never a target.
    pub const PROTECTED_NAMESPACE: &str = "ProtectedNamespace";
    /// `auth.mode: none`: every caller is anonymous (with the lowest role).
    pub const AUTH_MODE_NONE: &str = "AuthModeNone";
    /// Gateway mode: `upstream.service.name` names no Service.
    pub const UPSTREAM_NOT_FOUND: &str = "UpstreamNotFound";
    /// Gateway mode: the Service does not carry the opt-in annotation naming this server.
    pub const UPSTREAM_NOT_OPTED_IN: &str = "UpstreamNotOptedIn";
    /// The tool is not in its server's `allowedTools`.
    pub const NOT_ALLOWED: &str = "NotAllowed";
}

/// A condition for `generation`, without a transition time yet.
pub fn condition(
    type_: &str,
    ok: bool,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
) -> Condition {
    Condition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    }
}

/// `desired` with each condition's `lastTransitionTime` taken from `current` when its status
/// is unchanged, and `now` otherwise. Order follows `desired`.
pub fn merge(current: &[Condition], desired: Vec<Condition>, now: Time) -> Vec<Condition> {
    desired
        .into_iter()
        .map(|mut c| {
            c.last_transition_time = match current.iter().find(|o| o.type_ == c.type_) {
                Some(old) if old.status == c.status => old.last_transition_time.clone(),
                _ => now.clone(),
            };
            c
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn transition_time_moves_only_when_status_changes() {
        let first = merge(&[], vec![condition("Ready", false, "X", "m", Some(1))], at(10));
        assert_eq!(first[0].last_transition_time, at(10));
        let same = merge(&first, vec![condition("Ready", false, "Y", "other", Some(2))], at(20));
        assert_eq!(
            same[0].last_transition_time,
            at(10),
            "reason/message changes keep the time"
        );
        let flipped = merge(&same, vec![condition("Ready", true, "Ready", "ok", Some(2))], at(30));
        assert_eq!(flipped[0].last_transition_time, at(30));
    }
}
