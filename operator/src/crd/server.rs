use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};
use toolgate_config::{AuthMode, FailurePolicy};

use super::{conditions_schema, HasConditions};

/// An MCP endpoint in front of an existing service: the tools it serves, who may call them
/// and how. Rendered into the ConfigMap `<name>-toolgate` (ProxyConfig) and served by a
/// toolgate-proxy sidecar in `workloadRef`'s pods (Sidecar) or by a gateway Deployment in
/// front of `upstream.service` (Gateway). Secrets are referenced by name and mounted, never
/// copied.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "toolgate.dev",
    version = "v1alpha1",
    kind = "McpServer",
    namespaced,
    status = "McpServerStatus",
    shortname = "mcpsrv",
    category = "toolgate",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Tools","type":"integer","jsonPath":".status.tools"}"#,
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".spec.mode"}"#,
    printcolumn = r#"{"name":"Endpoint","type":"string","jsonPath":".status.endpoint"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = kube::core::Rule::new("self.mode == 'Gateway' || has(self.workloadRef)").message("Sidecar mode needs workloadRef: the Deployment to add the proxy to"))]
#[x_kube(validation = kube::core::Rule::new("self.mode == 'Gateway' || has(self.upstream.port)").message("Sidecar mode needs upstream.port: the service's port inside the pod"))]
#[x_kube(validation = kube::core::Rule::new("self.mode == 'Sidecar' || has(self.upstream.service)").message("Gateway mode needs upstream.service: the Service to put the gateway in front of"))]
#[serde(rename_all = "camelCase")]
pub struct McpServerSpec {
    /// `Sidecar`: the proxy runs in `workloadRef`'s pods. `Gateway`: its own Deployment.
    #[serde(default)]
    pub mode: ServerMode,
    /// The Deployment (same namespace) that gets the proxy as a native sidecar. The
    /// Deployment must opt in with the annotation `toolgate.dev/allow-mcp-server: <this
    /// server's name>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_ref: Option<WorkloadRef>,
    /// Where the service listens and how long calls may take.
    pub upstream: ServerUpstream,
    /// MCP port of the proxy.
    #[serde(default = "default_port")]
    #[x_kube(validation = kube::core::Rule::new("self >= 1 && self <= 65535").message("port must be 1-65535"))]
    pub port: i32,
    /// Admin port of the proxy (`/healthz`, `/readyz`, `/metrics`).
    #[serde(default = "default_admin_port")]
    #[x_kube(validation = kube::core::Rule::new("self >= 1 && self <= 65535").message("adminPort must be 1-65535"))]
    pub admin_port: i32,
    /// Serve read-tier GET and HEAD tools only (everything else is left out of the config).
    #[serde(default = "default_true")]
    pub read_only: bool,
    /// With `readOnly`, also serve read-tier POST tools (`safety: read_only`: a search
    /// endpoint that takes a body). PUT, PATCH and DELETE are never read tools.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_read_over_post: bool,
    /// Which McpTools this server serves; default: the ones whose `serverRef` names it. The
    /// tool's author sets its labels, so a selector narrows, it does not authorize: use
    /// `allowedTools` to decide whose tools are served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_selector: Option<LabelSelector>,
    /// McpTool names (metadata.name) this server serves; empty: every McpTool of the namespace
    /// that names it. Anyone who may create McpTools in the namespace can otherwise expose any
    /// operation of the upstream (within `readOnly` and the roles).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_tools: Vec<String>,
    /// Roles, lowest first; default `[viewer, operator, admin]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roles: Option<Vec<String>>,
    /// How callers authenticate. Required: `mode: none` must be said to serve without
    /// authentication (every caller is then anonymous with the lowest role, and the status
    /// carries the `Unauthenticated` condition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<ServerAuth>,
    /// Rate limits, and the Redis the replicas share them in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<ServerRateLimit>,
    /// 2025-era MCP sessions: sealed with a key the operator keeps in Secret
    /// `<server>-session-keys`, so every replica accepts every session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sessions: Option<ServerSessions>,
    /// Agent provenance audit (JSON lines on the proxy's stdout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit: Option<ServerAudit>,
    /// Logs and traces of the proxy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub telemetry: Option<Telemetry>,
    /// Browser `Origin`s allowed to call; default none (agents send no Origin).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_origins: Vec<String>,
    /// `Host` names served; default any (the proxy listens on all addresses in a pod).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_hosts: Vec<String>,
    /// Instructions sent to clients in the initialize result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// Proxy image; default the operator's `--proxy-image`. It must be in the operator's
    /// `--allowed-proxy-images` (by default the repository of `--proxy-image`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Image pull policy of the proxy container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,
    /// Resources of the proxy container; default requests 50m CPU and 32Mi, limit 128Mi. The
    /// CPU request, rounded up to whole cores, sets the proxy's worker threads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Gateway mode: replicas of the gateway Deployment (default 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
}

fn default_port() -> i32 {
    8931
}
fn default_admin_port() -> i32 {
    9464
}
fn default_true() -> bool {
    true
}

/// Where the proxy runs.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ServerMode {
    /// A native sidecar in the workload's pods; the upstream is `127.0.0.1:<upstream.port>`.
    #[default]
    Sidecar,
    /// A Deployment of the proxy in front of `upstream.service`.
    Gateway,
}

impl ServerMode {
    /// The mode as written in the spec.
    pub fn as_str(self) -> &'static str {
        match self {
            ServerMode::Sidecar => "Sidecar",
            ServerMode::Gateway => "Gateway",
        }
    }
}

/// The Deployment that gets the sidecar.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadRef {
    /// Only `Deployment`.
    #[serde(default = "deployment_kind")]
    #[x_kube(validation = kube::core::Rule::new("self == 'Deployment'").message("workloadRef.kind must be Deployment"))]
    pub kind: String,
    /// Name of the Deployment in the McpServer's namespace.
    pub name: String,
}

fn deployment_kind() -> String {
    "Deployment".into()
}

/// The service behind the proxy.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ServerUpstream {
    /// Sidecar mode: the service's port inside the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self >= 1 && self <= 65535").message("upstream.port must be 1-65535"))]
    pub port: Option<i32>,
    /// Gateway mode: the Service in the McpServer's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceRef>,
    /// Connect timeout in milliseconds (default 2000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_timeout_ms: Option<u64>,
    /// Default per-call timeout in milliseconds (default 10000, at most 29000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Largest upstream response body in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_response_bytes: Option<u64>,
    /// A credential the proxy sends upstream, read from a Secret key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<UpstreamCredentialRef>,
}

/// A Service and port.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ServiceRef {
    /// Name of a Service in the McpServer's namespace (a DNS-1035 label); the gateway calls
    /// `http://<name>.<namespace>.svc:<port>`.
    #[x_kube(validation = kube::core::Rule::new("size(self) <= 63 && self.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')").message("upstream.service.name must be a Service name in this namespace (a DNS-1035 label: lower-case letters, digits and '-', starting with a letter), not a host, address or URL"))]
    pub name: String,
    /// Service port.
    #[x_kube(validation = kube::core::Rule::new("self >= 1 && self <= 65535").message("upstream.service.port must be 1-65535"))]
    pub port: i32,
}

/// One key of a Secret in the McpServer's namespace. The Secret must carry the label
/// `toolgate.dev/usage: proxy` (unless the operator trusts every Secret of the namespace).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct SecretKeyRef {
    /// Secret name.
    pub name: String,
    /// Key in the Secret.
    pub key: String,
}

/// Upstream credential: `header: prefix + <the Secret key's content>`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamCredentialRef {
    /// Header to send, for example `Authorization`.
    pub header: String,
    /// Prefix before the secret, for example `Bearer `.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// Where the secret is.
    pub secret_ref: SecretKeyRef,
}

/// How callers authenticate.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("!(self.mode in ['bearer', 'apiKey', 'customHeaders']) || has(self.credentialsSecretRef)").message("bearer, apiKey and customHeaders modes need credentialsSecretRef"))]
#[x_kube(validation = kube::core::Rule::new("self.mode != 'oauth' || has(self.oauth)").message("oauth mode needs the oauth block"))]
pub struct ServerAuth {
    /// `none`, `bearer`, `apiKey`, `customHeaders` or `oauth`.
    pub mode: AuthMode,
    /// Header carrying the API key (default `X-API-Key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_header: Option<String>,
    /// customHeaders mode: the headers every caller must present.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub custom_headers: Vec<String>,
    /// The credentials file (docs/proxy-config.md) as a Secret key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret_ref: Option<SecretKeyRef>,
    /// OAuth 2.1 resource server settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oauth: Option<ServerOAuth>,
}

/// OAuth 2.1 resource server: JWT access tokens from `issuer` for `resource`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("has(self.jwksUrl) != has(self.jwksSecretRef)").message("set exactly one of oauth.jwksUrl and oauth.jwksSecretRef"))]
pub struct ServerOAuth {
    /// Expected `iss`.
    pub issuer: String,
    /// This endpoint's canonical URL, the expected audience; default `status.endpoint`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    /// JWKS URL of the issuer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks_url: Option<String>,
    /// A JWKS document kept in a Secret key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks_secret_ref: Option<SecretKeyRef>,
    /// Accepted algorithms (default RS256, ES256).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub algorithms: Vec<String>,
    /// Accepted JWT `typ` headers (default `at+jwt`, RFC 9068 access tokens; add `JWT` for an
    /// identity provider that issues its access tokens so, `""` for tokens without `typ`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub token_types: Vec<String>,
    /// Clock leeway in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leeway_seconds: Option<u64>,
    /// Scope to role.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub scope_roles: BTreeMap<String, String>,
    /// Role of a token without a mapped scope; default: refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_role: Option<String>,
}

/// Requests per window.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RateLimit {
    /// Requests allowed per window (at least 1).
    #[x_kube(validation = kube::core::Rule::new("self >= 1").message("requests must be at least 1"))]
    pub requests: i64,
    /// Window length in seconds (at least 1).
    #[x_kube(validation = kube::core::Rule::new("self >= 1").message("windowSeconds must be at least 1"))]
    pub window_seconds: i64,
}

/// Rate limits (GCRA): per client IP before anything else, per identity, per tool.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ServerRateLimit {
    /// Per client IP (default 120 per 60 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_ip: Option<RateLimit>,
    /// Per authenticated identity (default 60 per 60 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_identity: Option<RateLimit>,
    /// Per tool name, shared by all callers.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub per_tool: BTreeMap<String, RateLimit>,
    /// CIDRs of proxies whose `X-Forwarded-For` is trusted (an ingress in front).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trusted_proxies: Vec<String>,
    /// Most keys tracked per limiter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_keys: Option<i64>,
    /// Where per-identity and per-tool limits (and ended sessions) are shared by every
    /// replica; without it each replica counts on its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<ServerStore>,
}

/// A store shared by the replicas.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ServerStore {
    /// A Redis or Valkey server the platform already runs.
    pub redis: ServerRedis,
}

/// A Redis or Valkey server.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ServerRedis {
    /// `redis://host[:port][/db]` or `rediss://` (TLS); `valkey://`, `valkeys://` too. No user
    /// info: the password comes from `passwordSecretRef`.
    #[x_kube(validation = kube::core::Rule::new("self.matches('^(redis|rediss|valkey|valkeys)://[^@/?#]+([/?][^#]*)?$')").message("redis.url must be redis://host[:port][/db] (or rediss://, valkey://, valkeys://) without user info (put the password in passwordSecretRef) and without a #fragment"))]
    pub url: String,
    /// ACL user (Redis 6+).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// The password, from a Secret (labelled `toolgate.dev/usage: proxy`, like every Secret the
    /// proxy mounts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_secret_ref: Option<SecretKeyRef>,
    /// PEM CAs for `rediss://`, from a Secret; default the system's roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_secret_ref: Option<SecretKeyRef>,
    /// Put before every key; default `toolgate:<namespace>:<server>:`, so servers can share
    /// one Redis.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_prefix: Option<String>,
    /// Longest wait for one store operation, 1-1000 ms (default 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self >= 1 && self <= 1000").message("redis.timeoutMs must be 1-1000"))]
    pub timeout_ms: Option<i64>,
    /// While Redis does not answer: `failOpen` (default) counts on each replica's own limiter,
    /// `failClosed` refuses write-tier calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_policy: Option<FailurePolicy>,
}

/// 2025-era session settings.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ServerSessions {
    /// Seal session ids with the server's key (default true). `false`: sessions live in one
    /// proxy's memory, correct only for a single replica or behind sticky routing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed: Option<bool>,
    /// How long a session lives from `initialize`, in seconds (default 3600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self >= 60 && self <= 604800").message("sessions.ttlSeconds must be 60-604800 (one week)"))]
    pub ttl_seconds: Option<i64>,
    /// Raise to rotate the session key (default 1): the new key is first accepted by every
    /// replica, then seals, and the old one is dropped once its sessions have expired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self >= 1").message("sessions.keyGeneration must be at least 1"))]
    pub key_generation: Option<i64>,
}

impl ServerSessions {
    /// Whether ids are sealed.
    pub fn sealed(this: Option<&Self>) -> bool {
        this.and_then(|s| s.sealed).unwrap_or(true)
    }

    /// Session lifetime in seconds.
    pub fn ttl_seconds(this: Option<&Self>) -> u64 {
        this.and_then(|s| s.ttl_seconds)
            .and_then(|t| u64::try_from(t).ok())
            .unwrap_or_else(toolgate_config::defaults::session_ttl_seconds)
    }

    /// The key generation asked for.
    pub fn key_generation(this: Option<&Self>) -> i64 {
        this.and_then(|s| s.key_generation).unwrap_or(1).max(1)
    }
}

/// Agent provenance audit: one JSON line per tools/call on the proxy's stdout.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ServerAudit {
    /// Record calls (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// `failOpen` (default) or `failClosed`: refuse write tools while records are lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_policy: Option<FailurePolicy>,
    /// Argument names (JSON pointers) whose values are replaced in records.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub redact_arguments: Vec<String>,
    /// Records buffered before they are dropped and counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffer_size: Option<i64>,
}

/// Logs and traces of the proxy (environment of the proxy container).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Telemetry {
    /// `TOOLGATE_LOG`, for example `info` or `toolgate_proxy=debug`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_level: Option<String>,
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`; traces are off when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub otlp_endpoint: Option<String>,
    /// `OTEL_SERVICE_NAME`; default `<server>.<namespace>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_name: Option<String>,
}

/// Observed state of an McpServer, written by the operator.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct McpServerStatus {
    /// `Ready` (summary), `ConfigRendered`, `SidecarInjected` or `GatewayAvailable`.
    #[serde(default)]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
    /// The generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Tools in the rendered config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<i32>,
    /// SHA-256 of the rendered ProxyConfig (also the ConfigMap's annotation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_hash: Option<String>,
    /// In-cluster MCP URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
}

impl HasConditions for McpServerStatus {
    fn conditions(&self) -> &[Condition] {
        &self.conditions
    }
}
