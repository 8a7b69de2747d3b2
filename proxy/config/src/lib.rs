//! `toolgate-config`: the versioned `ProxyConfig` contract between the Toolgate operator
//! (which renders it into a ConfigMap) and `toolgate-proxy` (which serves it).
//!
//! Pure data: serde (camelCase, unknown keys rejected) + schemars, plus [`ProxyConfig::validate`]
//! which checks everything that can be checked without I/O and reports *every* problem with
//! the path of the offending key. No I/O, no async.

#![forbid(unsafe_code)]

mod baseurl;
mod cidr;
mod parse;
pub mod pointer;
mod policy;
pub mod schema;
mod template;
mod tool;
mod validate;
pub mod yaml;

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use baseurl::BaseUrl;
pub use cidr::Cidr;
pub use parse::{
    from_value, parse_json, parse_text, parse_text_unvalidated, parse_yaml, parse_yaml_value, ConfigError, LoadError,
};
pub use policy::*;
pub use template::{Segment, Template};
pub use tool::*;

/// The only `apiVersion` this crate reads and writes.
pub const API_VERSION: &str = "toolgate.dev/v1alpha1";
/// The `kind` of a proxy configuration document.
pub const KIND: &str = "ProxyConfig";
/// The stateless revision, the main path: every request carries its version, capabilities and
/// client info in `_meta`; no `initialize`, no session.
pub const MODERN_PROTOCOL_VERSION: &str = "2026-07-28";
/// The session-based revisions `initialize` negotiates, newest first.
pub const LEGACY_PROTOCOL_VERSIONS: [&str; 3] = ["2025-11-25", "2025-06-18", "2025-03-26"];
/// Every revision served on the endpoint, newest first (`server/discover`'s `supportedVersions`).
pub const SUPPORTED_PROTOCOL_VERSIONS: [&str; 4] = [MODERN_PROTOCOL_VERSION, "2025-11-25", "2025-06-18", "2025-03-26"];
/// Default per-tool upstream timeout.
pub const DEFAULT_TOOL_TIMEOUT_MS: u64 = 25_000;
/// Hard ceiling for any tool timeout: clients give up on `tools/call` after 30 s.
pub const MAX_TOOL_TIMEOUT_MS: u64 = 29_000;

/// A complete proxy configuration: where to listen, which upstream to call, and the tools.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(title = "ProxyConfig")]
pub struct ProxyConfig {
    /// Must be `toolgate.dev/v1alpha1`.
    pub api_version: String,
    /// Must be `ProxyConfig`.
    pub kind: String,
    /// The MCP listener, admin listener and session settings.
    #[serde(default)]
    pub server: ServerConfig,
    /// The HTTP service the tools call.
    pub upstream: UpstreamConfig,
    /// Authentication, authorization, rate limits, audit and provenance.
    #[serde(default)]
    pub policy: PolicyConfig,
    /// The tools published over MCP, in `tools/list` order.
    #[serde(default)]
    pub tools: Vec<ToolConfig>,
}

/// MCP listener settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServerConfig {
    /// Address of the MCP endpoint (`host:port`). Changing it needs a restart.
    #[serde(default = "defaults::listen")]
    pub listen: String,
    /// HTTP path of the MCP endpoint.
    #[serde(default = "defaults::path")]
    pub path: String,
    /// Address of the admin endpoint (`/healthz`, `/readyz`, `/metrics`, `/loglevel`). Changing
    /// it needs a restart.
    #[serde(default = "defaults::admin_listen")]
    pub admin_listen: String,
    /// Address of a listener that serves `/metrics` alone; when set, the admin listener no
    /// longer serves it, so the probes' port can stay open to the kubelet while metrics (tool
    /// names, call counts, refusal reasons) are reachable only where a NetworkPolicy allows.
    /// Changing it needs a restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_listen: Option<String>,
    /// File (a mounted Secret) holding the token that `PUT /loglevel` requires as
    /// `Authorization: Bearer <token>` (at least 16 characters). Without it, `PUT /loglevel` is
    /// refused: in a pod every container shares the loopback address, so being local proves
    /// nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_token_file: Option<String>,
    /// Browser Origins allowed to call the endpoint (`scheme://host[:port]`, or `*`). Empty:
    /// only requests without an `Origin` header or from a loopback Origin (`localhost`,
    /// `127.0.0.1`, `[::1]`, any port).
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    /// Host names the endpoint answers to (DNS-rebinding protection), without ports. Empty:
    /// loopback names only when `listen` is a loopback address, any host otherwise.
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// Largest accepted request body; larger ones get HTTP 413.
    #[serde(default = "defaults::max_body_bytes")]
    pub max_body_bytes: u64,
    /// How long a session lives (its id then answers 404 and the client initializes again): idle
    /// time for in-memory sessions, time since `initialize` for sealed ones.
    #[serde(default = "defaults::session_ttl_seconds")]
    pub session_ttl_seconds: u64,
    /// File (a mounted Secret) of session keys, one base64-encoded 32-byte key per line, the
    /// first sealing new ids and every one opening them. With it, a session id is sealed
    /// (XChaCha20-Poly1305) and every replica holding the same file accepts it without a
    /// lookup; without it, sessions live in this process's memory (one replica only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_key_file: Option<String>,
    /// Upper bound of live sessions; the longest-idle one is ended to make room.
    #[serde(default = "defaults::max_sessions")]
    pub max_sessions: usize,
    /// Open client connections at most; further connections are closed at once. Each costs
    /// about 18 KiB even idle, so the default keeps a flood of idle connections under 40 MiB,
    /// inside the sidecar's memory limit. Changing it needs a restart.
    #[serde(default = "defaults::max_connections")]
    pub max_connections: usize,
    /// Open connections at most from one client address (IPv6: one /64); further ones from it
    /// are closed at once, so one address cannot take every connection. Peers in
    /// `policy.rateLimit.trustedProxies` (a load balancer or ingress) are not limited. Changing
    /// it needs a restart.
    #[serde(default = "defaults::max_connections_per_ip")]
    pub max_connections_per_ip: usize,
    /// Tools per `tools/list` page.
    #[serde(default = "defaults::page_size")]
    pub page_size: usize,
    /// `serverInfo.name` sent at initialize.
    #[serde(default = "defaults::server_name")]
    pub name: String,
    /// Optional `instructions` sent at initialize.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// How long SIGTERM waits for in-flight calls before exiting.
    #[serde(default = "defaults::shutdown_grace_seconds")]
    pub shutdown_grace_seconds: u64,
    /// After SIGTERM, how long to keep serving (with `/readyz` failing) before the listeners
    /// close, so load balancers and Service endpoints stop sending traffic first.
    #[serde(default)]
    pub shutdown_delay_seconds: u64,
    /// 2026-07-28 `tools/list` and `server/discover` results may be cached this long by clients
    /// (`ttlMs`); a `subscriptions/listen` stream learns of changes at once.
    #[serde(default = "defaults::list_ttl_ms")]
    pub list_ttl_ms: u64,
    /// Open `subscriptions/listen` streams at most, in total.
    #[serde(default = "defaults::max_listeners")]
    pub max_listeners: usize,
    /// Open `subscriptions/listen` streams at most per authenticated identity.
    #[serde(default = "defaults::max_listeners_per_identity")]
    pub max_listeners_per_identity: usize,
    /// Seconds between keep-alive comments on a `subscriptions/listen` stream; the caller's
    /// credentials are checked again at each.
    #[serde(default = "defaults::listen_keep_alive_seconds")]
    pub listen_keep_alive_seconds: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: defaults::listen(),
            path: defaults::path(),
            admin_listen: defaults::admin_listen(),
            metrics_listen: None,
            admin_token_file: None,
            allowed_origins: Vec::new(),
            allowed_hosts: Vec::new(),
            max_body_bytes: defaults::max_body_bytes(),
            session_ttl_seconds: defaults::session_ttl_seconds(),
            session_key_file: None,
            max_sessions: defaults::max_sessions(),
            max_connections: defaults::max_connections(),
            max_connections_per_ip: defaults::max_connections_per_ip(),
            page_size: defaults::page_size(),
            name: defaults::server_name(),
            instructions: None,
            shutdown_grace_seconds: defaults::shutdown_grace_seconds(),
            shutdown_delay_seconds: 0,
            list_ttl_ms: defaults::list_ttl_ms(),
            max_listeners: defaults::max_listeners(),
            max_listeners_per_identity: defaults::max_listeners_per_identity(),
            listen_keep_alive_seconds: defaults::listen_keep_alive_seconds(),
        }
    }
}

/// The service behind the proxy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpstreamConfig {
    /// `http://host[:port][/prefix]`; a sidecar uses `http://127.0.0.1:<port>`. Only a host (DNS
    /// name, dotted-quad IPv4 or `[IPv6]`), a port and a prefix of plain path segments: no user
    /// info or `@`, query, fragment, percent-encoding, backslash, `.`/`..` segments, or `:` in
    /// the path (the mark of a `host:port` that ended up there).
    pub base_url: String,
    /// TCP connect timeout.
    #[serde(default = "defaults::connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// Default per-call timeout (a tool's `http.timeoutMs` overrides it). At most 29000.
    #[serde(default = "defaults::tool_timeout_ms")]
    pub timeout_ms: u64,
    /// Idle keep-alive connections kept per upstream host.
    #[serde(default = "defaults::pool_max_idle")]
    pub pool_max_idle: usize,
    /// How long an idle pooled connection is kept.
    #[serde(default = "defaults::pool_idle_timeout_ms")]
    pub pool_idle_timeout_ms: u64,
    /// Largest upstream response body read; larger ones fail the call.
    #[serde(default = "defaults::max_response_bytes")]
    pub max_response_bytes: u64,
    /// A credential sent to the upstream on every call, from its own file (never the client's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<UpstreamCredential>,
}

impl PolicyConfig {
    /// The role a caller needs for `tool`: its `requiredRole`, else, for a write-tier tool, the
    /// second-lowest role (`operator` with the default roles), so that the lowest role (and the
    /// anonymous caller of `auth.mode: none`) never writes by default. `requiredRole` set to
    /// the lowest role opens a write tool to every caller. `None`: any caller.
    pub fn required_role<'a>(&'a self, tool: &'a ToolConfig) -> Option<&'a str> {
        match &tool.required_role {
            Some(r) => Some(r.as_str()),
            None if tool.effective_tier() == Tier::Write => self.roles.get(1).map(String::as_str),
            None => None,
        }
    }

    /// Rank (index in `roles`) of [`Self::required_role`]: 0 for any caller, `usize::MAX` for
    /// a role that is not in `roles` (validation refuses that).
    pub fn required_rank(&self, tool: &ToolConfig) -> usize {
        self.required_role(tool)
            .map_or(0, |r| self.roles.iter().position(|x| x == r).unwrap_or(usize::MAX))
    }

    /// Whether this policy lists and serves `tool` at all (before roles and allowlists): every
    /// tool when not read-only, otherwise see [`ToolConfig::served_read_only`].
    pub fn serves(&self, tool: &ToolConfig) -> bool {
        !self.read_only || tool.served_read_only(self.allow_read_over_post)
    }
}

impl UpstreamConfig {
    /// An upstream at `base_url` with every other setting at its default.
    pub fn new(base_url: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            connect_timeout_ms: defaults::connect_timeout_ms(),
            timeout_ms: defaults::tool_timeout_ms(),
            pool_max_idle: defaults::pool_max_idle(),
            pool_idle_timeout_ms: defaults::pool_idle_timeout_ms(),
            max_response_bytes: defaults::max_response_bytes(),
            credential: None,
        }
    }
}

impl ProxyConfig {
    /// A config with default server settings, the given upstream and tools.
    pub fn new(upstream: UpstreamConfig, tools: Vec<ToolConfig>) -> Self {
        Self {
            api_version: API_VERSION.into(),
            kind: KIND.into(),
            server: ServerConfig::default(),
            upstream,
            policy: PolicyConfig::default(),
            tools,
        }
    }

    /// Settings that were unusable and fell back to their defaults (rate limits), one line each.
    pub fn warnings(&self) -> Vec<String> {
        self.resolved_limits().1
    }

    /// The effective rate limits and any fallback warnings.
    pub fn resolved_limits(&self) -> (ResolvedLimits, Vec<String>) {
        let rl = &self.policy.rate_limit;
        let mut warnings = Vec::new();
        let mut resolve = |l: &LimitConfig, path: &str, requests: u64, window: u64| -> Limit {
            let mut get = |v: Option<&Value>, key: &str, default: u64| match positive_setting(v) {
                Ok(n) => n,
                Err(why) => {
                    if v.is_some() {
                        warnings.push(format!("{path}.{key}: {why}; using the default {default}"));
                    }
                    default
                }
            };
            Limit {
                requests: get(l.requests.as_ref(), "requests", requests),
                window_seconds: get(l.window_seconds.as_ref(), "windowSeconds", window),
            }
        };
        let per_ip = resolve(&rl.per_ip, "policy.rateLimit.perIp", 120, 60);
        let per_identity = resolve(&rl.per_identity, "policy.rateLimit.perIdentity", 60, 60);
        let per_tool = rl
            .per_tool
            .iter()
            .map(|(k, l)| (k.clone(), resolve(l, &format!("policy.rateLimit.perTool.{k}"), 60, 60)))
            .collect();
        let max_keys = match positive_setting(rl.max_keys.as_ref()) {
            Ok(n) => n as usize,
            Err(why) => {
                if rl.max_keys.is_some() {
                    warnings.push(format!("policy.rateLimit.maxKeys: {why}; using the default 50000"));
                }
                50_000
            }
        };
        (
            ResolvedLimits {
                per_ip,
                per_identity,
                per_tool,
                max_keys,
            },
            warnings,
        )
    }

    /// The JSON Schema of this document (checked in as `proxy/config/proxy-config.schema.json`).
    pub fn json_schema() -> Value {
        serde_json::to_value(schemars::schema_for!(ProxyConfig)).unwrap_or(Value::Null)
    }
}

/// `requests` per `window_seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// Requests per window.
    pub requests: u64,
    /// Window length in seconds.
    pub window_seconds: u64,
}

/// Rate limits with defaults applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedLimits {
    /// Per client IP, before authentication.
    pub per_ip: Limit,
    /// Per identity, `tools/call` only.
    pub per_identity: Limit,
    /// Per identity and tool.
    pub per_tool: BTreeMap<String, Limit>,
    /// Keys tracked per limiter.
    pub max_keys: usize,
}

/// Default values, shared with the operator so both sides agree.
pub mod defaults {
    /// `127.0.0.1:8931`
    pub fn listen() -> String {
        "127.0.0.1:8931".into()
    }
    /// `/mcp`
    pub fn path() -> String {
        "/mcp".into()
    }
    /// `127.0.0.1:9464`
    pub fn admin_listen() -> String {
        "127.0.0.1:9464".into()
    }
    /// 1 MiB.
    pub fn max_body_bytes() -> u64 {
        1024 * 1024
    }
    /// One hour.
    pub fn session_ttl_seconds() -> u64 {
        3600
    }
    /// 10,000 sessions.
    pub fn max_sessions() -> usize {
        10_000
    }
    /// 2,048 connections.
    pub fn max_connections() -> usize {
        2048
    }
    /// 256 connections from one address.
    pub fn max_connections_per_ip() -> usize {
        256
    }
    /// 100 tools per page.
    pub fn page_size() -> usize {
        100
    }
    /// `toolgate`
    pub fn server_name() -> String {
        "toolgate".into()
    }
    /// 20 s, inside Kubernetes' default 30 s termination grace period.
    pub fn shutdown_grace_seconds() -> u64 {
        20
    }
    /// 60 s.
    pub fn list_ttl_ms() -> u64 {
        60_000
    }
    /// 1000.
    pub fn max_listeners() -> usize {
        1000
    }
    /// 4.
    pub fn max_listeners_per_identity() -> usize {
        4
    }
    /// 15 s.
    pub fn listen_keep_alive_seconds() -> u64 {
        15
    }
    /// 2 s.
    pub fn connect_timeout_ms() -> u64 {
        2_000
    }
    /// 25 s.
    pub fn tool_timeout_ms() -> u64 {
        super::DEFAULT_TOOL_TIMEOUT_MS
    }
    /// 64 idle connections.
    pub fn pool_max_idle() -> usize {
        64
    }
    /// 90 s.
    pub fn pool_idle_timeout_ms() -> u64 {
        90_000
    }
    /// 4 MiB.
    pub fn max_response_bytes() -> u64 {
        4 * 1024 * 1024
    }
}
