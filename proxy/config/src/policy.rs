//! Policy settings: authentication, authorization, rate limits, audit and provenance.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Who may call what, how often, and what is recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicyConfig {
    /// While true only safe tools are listed or callable: read-tier GET and HEAD tools, and
    /// read-tier POST tools (`safety: read_only`) when `allowReadOverPost` is set.
    #[serde(default = "default_true")]
    pub read_only: bool,
    /// Serve read-tier POST tools (search or query endpoints that take a body, `safety:
    /// read_only`) in read-only mode too. Off: a read-only server serves GET and HEAD only,
    /// whatever tier a tool declares.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    #[schemars(extend("default" = false))]
    pub allow_read_over_post: bool,
    /// Roles from lowest to highest; a caller with a role may call tools requiring it or any
    /// role below it.
    #[serde(default = "default_roles")]
    pub roles: Vec<String>,
    /// How callers authenticate.
    #[serde(default)]
    pub auth: AuthConfig,
    /// Request and call limits.
    #[serde(default)]
    pub rate_limit: RateLimitConfig,
    /// Agent provenance audit.
    #[serde(default)]
    pub audit: AuditConfig,
    /// Headers that carry provenance to the upstream.
    #[serde(default)]
    pub provenance: ProvenanceConfig,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            read_only: true,
            allow_read_over_post: false,
            roles: default_roles(),
            auth: AuthConfig::default(),
            rate_limit: RateLimitConfig::default(),
            audit: AuditConfig::default(),
            provenance: ProvenanceConfig::default(),
        }
    }
}

fn default_true() -> bool {
    true
}

/// `viewer < operator < admin`.
pub fn default_roles() -> Vec<String> {
    vec!["viewer".into(), "operator".into(), "admin".into()]
}

/// Authentication mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum AuthMode {
    /// No credentials; every caller is `anonymous` with the lowest role, so tools with a
    /// `requiredRole` above it are hidden: role-gated tools need real credentials.
    #[default]
    None,
    /// `Authorization: Bearer <token>`, tokens from `credentialsFile`.
    Bearer,
    /// An API key in `apiKeyHeader`, keys from `credentialsFile`.
    ApiKey,
    /// Every header in `customHeaders` must match one credential's values.
    CustomHeaders,
    /// OAuth 2.1 resource server: JWT access tokens checked against an issuer's keys.
    Oauth,
}

/// How callers authenticate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuthConfig {
    /// `none`, `bearer`, `apiKey`, `customHeaders` or `oauth`.
    #[serde(default)]
    pub mode: AuthMode,
    /// Header carrying the API key in `apiKey` mode.
    #[serde(default = "default_api_key_header")]
    pub api_key_header: String,
    /// Header names that must all match in `customHeaders` mode.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub custom_headers: Vec<String>,
    /// Credentials file (a mounted Secret): keys or tokens with id, role, tool allowlist and
    /// expiry. Re-read with the config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_file: Option<String>,
    /// OAuth 2.1 resource-server settings (`oauth` mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oauth: Option<OAuthConfig>,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            mode: AuthMode::None,
            api_key_header: default_api_key_header(),
            custom_headers: Vec::new(),
            credentials_file: None,
            oauth: None,
        }
    }
}

fn default_api_key_header() -> String {
    "X-API-Key".into()
}

/// OAuth 2.1 resource server settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OAuthConfig {
    /// Expected `iss`, and the authorization server advertised in the resource metadata.
    pub issuer: String,
    /// This resource's canonical URI (for example `https://mcp.example.com/mcp`): the required
    /// `aud`, and the `resource` of the RFC 9728 metadata.
    pub resource: String,
    /// JWKS file (a mounted Secret or ConfigMap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks_file: Option<String>,
    /// JWKS URL: `https://`, or `http://` only to a loopback host (`localhost`, `127.0.0.0/8`,
    /// `[::1]`). Cached and refreshed in the background; one fetch at a time, 5 s for the whole
    /// response. An unknown `kid` triggers a refresh at most once per jwksRefreshSeconds for
    /// that `kid`, and at most once per min(30 s, jwksRefreshSeconds) overall.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks_url: Option<String>,
    /// Accepted signature algorithms (`none` is never accepted).
    #[serde(default = "default_algorithms")]
    pub algorithms: Vec<String>,
    /// Accepted JOSE header `typ` values, compared case-insensitively and with or without the
    /// `application/` prefix. RFC 9068 access tokens are `at+jwt`; add `JWT` for identity
    /// providers that label access tokens that way, and `""` to accept tokens without `typ`.
    #[serde(default = "default_token_types")]
    pub token_types: Vec<String>,
    /// Clock skew tolerated on `exp` and `nbf`.
    #[serde(default = "default_leeway")]
    pub leeway_seconds: u64,
    /// Scope → role; a token gets the highest role among its scopes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub scope_roles: BTreeMap<String, String>,
    /// Role for a valid token none of whose scopes is mapped; none: such tokens are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_role: Option<String>,
    /// How long fetched keys are used before they are fetched again.
    #[serde(default = "default_jwks_refresh")]
    pub jwks_refresh_seconds: u64,
}

fn default_algorithms() -> Vec<String> {
    vec!["RS256".into(), "ES256".into()]
}

/// `["at+jwt"]`: RFC 9068 JWT access tokens only.
pub fn default_token_types() -> Vec<String> {
    vec!["at+jwt".into()]
}

fn default_leeway() -> u64 {
    60
}

fn default_jwks_refresh() -> u64 {
    300
}

impl OAuthConfig {
    /// Problems of these settings that serde cannot express (paths under `policy.auth.oauth`).
    pub fn problems(&self) -> Vec<crate::ConfigError> {
        let mut errs = Vec::new();
        if let Some(url) = &self.jwks_url {
            if let Err(e) = check_jwks_url(url) {
                errs.push(crate::ConfigError::new("policy.auth.oauth.jwksUrl", e));
            }
        }
        if self.token_types.is_empty() {
            errs.push(crate::ConfigError::new(
                "policy.auth.oauth.tokenTypes",
                "must list at least one `typ` (for example `at+jwt`; `\"\"` accepts tokens without `typ`)",
            ));
        }
        errs
    }
}

/// A JWKS URL must be `https://`; plain `http://` is accepted only to a loopback host, where
/// nobody on the network can swap the keys.
pub fn check_jwks_url(url: &str) -> Result<(), String> {
    let lower = url.to_ascii_lowercase();
    let (https, rest) = match (lower.strip_prefix("https://"), lower.strip_prefix("http://")) {
        (Some(rest), _) => (true, rest),
        (None, Some(rest)) => (false, rest),
        (None, None) => return Err(format!("`{url}` must be an https:// URL")),
    };
    if rest.contains('#') {
        // The client reads `#insecure` as "skip certificate checks".
        return Err("must not have a fragment (`#...`): certificate checks cannot be turned off".into());
    }
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    // Not echoed: the URL holds a credential, which would end up in logs and status.
    if authority.contains('@') {
        return Err(
            "must not carry user info (`user:password@`): a credential in a URL ends up in logs; serve the keys without one"
                .into(),
        );
    }
    if https {
        return Ok(());
    }
    let host_port = authority;
    let host = match host_port.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host_port.split(':').next().unwrap_or(""),
    };
    let loopback = host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if loopback {
        Ok(())
    } else {
        Err(format!(
            "`{url}` must be an https:// URL: keys fetched over plain http could be replaced by anyone on the path (http:// is accepted only for localhost and loopback addresses)"
        ))
    }
}

/// Algorithms the proxy can verify.
pub const SUPPORTED_ALGORITHMS: [&str; 9] = [
    "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA",
];

/// Request and call limits.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RateLimitConfig {
    /// Pre-authentication limit per client IP (every request). Default 120 per 60 s.
    #[serde(default)]
    pub per_ip: LimitConfig,
    /// Limit of `tools/call` per authenticated identity. Default 60 per 60 s.
    #[serde(default)]
    pub per_identity: LimitConfig,
    /// Optional limits of one tool's calls per identity, by tool name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub per_tool: BTreeMap<String, LimitConfig>,
    /// CIDRs of proxies whose `X-Forwarded-For` is believed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trusted_proxies: Vec<String>,
    /// Most keys each limiter tracks (default 50000); the least recently used go first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "loose_number")]
    pub max_keys: Option<Value>,
    /// Where the per-identity and per-tool limits (and session revocations) are counted so
    /// that every replica shares them. Without it each replica counts on its own. The per-IP
    /// limit is always local: it runs before authentication and must cost nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<StoreConfig>,
}

/// A store shared by the replicas of one server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StoreConfig {
    /// A Redis (or Valkey) server.
    pub redis: RedisConfig,
}

/// A Redis or Valkey server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RedisConfig {
    /// `redis://host[:port][/db]`, or `rediss://` for TLS (`valkey://`, `valkeys://` too). No
    /// user info: the password comes from `passwordFile`, the user from `username`.
    pub url: String,
    /// ACL user name (Redis 6+); without it, the default user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// File (a mounted Secret) holding the password (surrounding whitespace trimmed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_file: Option<String>,
    /// PEM bundle of the CAs that sign the server's certificate (`rediss://`); without it, the
    /// system's roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    /// Put before every key, so several servers can share one Redis. Default `toolgate:`.
    #[serde(default = "default_key_prefix")]
    pub key_prefix: String,
    /// How long one store operation may take (1-1000 ms, default 50); past it, or while the
    /// store is unreachable, `failurePolicy` decides.
    #[serde(default = "default_store_timeout_ms")]
    pub timeout_ms: u64,
    /// While the store cannot answer: `failOpen` counts on this replica's own limiter (each
    /// replica then admits the full limit), `failClosed` refuses write-tier calls and counts
    /// reads locally.
    #[serde(default)]
    pub failure_policy: FailurePolicy,
}

fn default_key_prefix() -> String {
    "toolgate:".into()
}

fn default_store_timeout_ms() -> u64 {
    50
}

/// Why a Redis URL is unusable (never echoing user info).
pub fn check_redis_url(url: &str) -> Result<(), String> {
    let lower = url.to_ascii_lowercase();
    let Some(rest) = ["redis://", "rediss://", "valkey://", "valkeys://"]
        .iter()
        .find_map(|s| lower.strip_prefix(s))
    else {
        return Err("must start with redis://, rediss://, valkey:// or valkeys://".into());
    };
    if rest.contains('#') {
        // The client reads `#insecure` as "skip certificate checks".
        return Err("must not have a fragment (`#...`): certificate checks cannot be turned off".into());
    }
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    if authority.contains('@') {
        return Err("must not hold user info: put the password in `passwordFile` and the user in `username`".into());
    }
    if authority.is_empty() {
        return Err("has no host".into());
    }
    Ok(())
}

/// `requests` per `windowSeconds`. Missing, zero, negative or non-numeric values fall back to
/// the default with a warning.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LimitConfig {
    /// Requests allowed per window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "loose_number")]
    pub requests: Option<Value>,
    /// Window length in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "loose_number")]
    pub window_seconds: Option<Value>,
}

fn loose_number(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "description": "A positive number; anything else falls back to the default with a warning.",
        "type": ["integer", "number", "string", "null"]
    })
}

/// A positive whole number read leniently, or why not.
pub fn positive_setting(v: Option<&Value>) -> Result<u64, String> {
    let Some(v) = v else { return Err("missing".into()) };
    let n = match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse::<f64>().ok(),
        _ => None,
    };
    match n {
        Some(n) if n.is_finite() && n >= 1.0 => Ok(n as u64),
        Some(n) => Err(format!("{n} is not positive")),
        None => Err(format!("{v} is not a number")),
    }
}

/// Where audit records go.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum AuditSink {
    /// JSON lines on stdout (diagnostic logs go to stderr).
    #[default]
    Stdout,
    /// JSON lines appended to `path`.
    File,
}

/// What happens to write-tier calls while audit records cannot be written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum FailurePolicy {
    /// Calls go on; lost records are counted.
    #[default]
    FailOpen,
    /// Write-tier calls are refused until records can be written again; reads go on.
    FailClosed,
}

/// Agent provenance audit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuditConfig {
    /// Off: no records are written.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// `stdout` or `file`.
    #[serde(default)]
    pub sink: AuditSink,
    /// File for the `file` sink.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Records buffered before new ones are dropped (and counted).
    #[serde(default = "default_audit_buffer")]
    pub buffer_size: usize,
    /// `failOpen` or `failClosed`.
    #[serde(default)]
    pub failure_policy: FailurePolicy,
    /// JSON pointers into the arguments replaced by `"[REDACTED]"` in records (the digest is
    /// computed before redaction).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub redact_arguments: Vec<String>,
}

impl Default for AuditConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            sink: AuditSink::Stdout,
            path: None,
            buffer_size: default_audit_buffer(),
            failure_policy: FailurePolicy::FailOpen,
            redact_arguments: Vec::new(),
        }
    }
}

fn default_audit_buffer() -> usize {
    10_000
}

/// Provenance headers sent upstream (and stripped from what clients send).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProvenanceConfig {
    /// Authenticated subject (key id or JWT `sub`).
    #[serde(default = "h_subject")]
    pub subject_header: String,
    /// Acting agent (JWT `act`/`azp`/`client_id`, or the trusted agent header).
    #[serde(default = "h_agent")]
    pub agent_header: String,
    /// Tool name.
    #[serde(default = "h_tool")]
    pub tool_header: String,
    /// MCP session id.
    #[serde(default = "h_session")]
    pub session_header: String,
    /// A client header naming the agent, believed only from a trusted proxy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trusted_agent_header: Option<String>,
}

impl Default for ProvenanceConfig {
    fn default() -> Self {
        Self {
            subject_header: h_subject(),
            agent_header: h_agent(),
            tool_header: h_tool(),
            session_header: h_session(),
            trusted_agent_header: None,
        }
    }
}

fn h_subject() -> String {
    "X-Toolgate-Subject".into()
}
fn h_agent() -> String {
    "X-Toolgate-Agent".into()
}
fn h_tool() -> String {
    "X-Toolgate-Tool".into()
}
fn h_session() -> String {
    "X-Toolgate-Session".into()
}

/// A credential the proxy sends upstream, read from its own file (a mounted Secret).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpstreamCredential {
    /// Header to set, e.g. `Authorization`.
    pub header: String,
    /// File holding the value (surrounding whitespace trimmed).
    pub file: String,
    /// Text put before the value, e.g. `"Bearer "`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jwks_urls_with_user_info_are_refused_without_echoing_it() {
        for url in [
            "https://user:s3cret@idp.example/jwks",
            "http://user:s3cret@127.0.0.1:8/jwks",
        ] {
            let e = check_jwks_url(url).unwrap_err();
            assert!(e.contains("user info") && !e.contains("s3cret"), "{e}");
        }
    }

    #[test]
    fn redis_urls_are_checked_without_echoing_user_info() {
        for ok in [
            "redis://10.0.0.5:6379/0",
            "rediss://redis.example:6380",
            "valkey://v",
            "REDIS://h",
        ] {
            assert_eq!(check_redis_url(ok), Ok(()), "{ok}");
        }
        let e = check_redis_url("redis://default:s3cret@10.0.0.5:6379").unwrap_err();
        assert!(e.contains("passwordFile") && !e.contains("s3cret"), "{e}");
        assert!(check_redis_url("http://10.0.0.5").unwrap_err().contains("redis://"));
        assert!(check_redis_url("redis:///0").unwrap_err().contains("no host"));
        assert!(check_redis_url("rediss://r:6380/#insecure")
            .unwrap_err()
            .contains("fragment"));
    }

    #[test]
    fn jwks_urls_need_https_except_to_loopback() {
        for ok in [
            "https://issuer.example.com/.well-known/jwks.json",
            "HTTPS://issuer.example.com/jwks",
            "http://127.0.0.1:8080/jwks.json",
            "http://127.9.9.9/jwks",
            "http://localhost/jwks",
            "http://LOCALHOST:9000",
            "http://[::1]:8080/jwks",
        ] {
            assert_eq!(check_jwks_url(ok), Ok(()), "{ok}");
        }
        for bad in [
            "http://issuer.example.com/jwks",
            "http://10.0.0.1/jwks",
            "http://[::2]/jwks",
            "http://localhost.evil.example/jwks",
            "http://127.0.0.1.evil.example/jwks",
            "ftp://localhost/jwks",
            "issuer.example.com/jwks",
        ] {
            let e = check_jwks_url(bad).unwrap_err();
            assert!(e.contains("https://"), "{bad}: {e}");
        }
    }

    #[test]
    fn oauth_problems_name_the_key() {
        let o: OAuthConfig = serde_json::from_value(serde_json::json!({
            "issuer": "https://issuer.test", "resource": "https://mcp.test/mcp",
            "jwksUrl": "http://issuer.test/jwks", "tokenTypes": []
        }))
        .unwrap();
        let paths: Vec<String> = o.problems().into_iter().map(|e| e.path).collect();
        assert_eq!(paths, ["policy.auth.oauth.jwksUrl", "policy.auth.oauth.tokenTypes"]);
        let d: OAuthConfig = serde_json::from_value(serde_json::json!({
            "issuer": "https://issuer.test", "resource": "https://mcp.test/mcp", "jwksUrl": "https://issuer.test/jwks"
        }))
        .unwrap();
        assert_eq!(d.token_types, ["at+jwt"]);
        assert!(d.problems().is_empty());
    }
}
