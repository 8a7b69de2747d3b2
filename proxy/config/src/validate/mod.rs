//! Whole-document checks that serde cannot express. Every problem is collected; nothing
//! stops at the first one.

mod tool;

use tool::validate_tool;
#[cfg(test)]
mod tests;

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;

use crate::pointer::Pointer;
use crate::{ConfigError, ProxyConfig, API_VERSION, KIND, MAX_TOOL_TIMEOUT_MS};

/// Headers a tool may not set: hop-by-hop, framing, and the proxy's own provenance headers.
pub const RESERVED_HEADERS: [&str; 11] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "proxy-authorization",
    "proxy-connection",
    "traceparent",
];

/// The largest request body a config may allow (64 MiB).
pub const MAX_BODY_LIMIT: u64 = 64 * 1024 * 1024;

impl ProxyConfig {
    /// Checks everything serde cannot: versions, addresses, URLs, tool names, schemas,
    /// mappings and pointers. Returns every problem found.
    ///
    /// Every distinct schema is compiled to check it and its validator dropped at once, so the
    /// check of 1,000 distinct schemas never holds 1,000 validators: serving compiles a tool's
    /// validator again on its first call ([`crate::schema::LazyValidator`]).
    pub fn validate(&self) -> Result<(), Vec<ConfigError>> {
        let mut errs = Vec::new();
        if self.api_version != API_VERSION {
            errs.push(ConfigError::new(
                "apiVersion",
                format!("must be `{API_VERSION}`, found `{}`", self.api_version),
            ));
        }
        if self.kind != KIND {
            errs.push(ConfigError::new(
                "kind",
                format!("must be `{KIND}`, found `{}`", self.kind),
            ));
        }
        self.validate_server(&mut errs);
        self.validate_upstream(&mut errs);
        self.validate_policy(&mut errs);
        let mut seen: HashMap<&str, usize> = HashMap::new();
        let mut schemas = crate::schema::Checker::default();
        let provenance = self.provenance_headers();
        for (i, tool) in self.tools.iter().enumerate() {
            let at = format!("tools[{i}] ({})", tool.name);
            if let Some(first) = seen.insert(&tool.name, i) {
                seen.insert(&tool.name, first);
                errs.push(ConfigError::new(
                    format!("{at}.name"),
                    format!("duplicate tool name `{}` (first declared at tools[{first}])", tool.name),
                ));
            }
            validate_tool(tool, &at, &mut schemas, &mut errs);
            if let Some(role) = &tool.required_role {
                if !self.policy.roles.contains(role) {
                    errs.push(ConfigError::new(
                        format!("{at}.requiredRole"),
                        format!("`{role}` is not one of policy.roles ({})", self.policy.roles.join(", ")),
                    ));
                }
            }
            for name in tool.http.headers.keys() {
                if provenance.contains(&name.to_ascii_lowercase()) {
                    errs.push(ConfigError::new(
                        format!("{at}.http.headers.{name}"),
                        format!("`{name}` is a provenance header set by the proxy"),
                    ));
                }
            }
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(errs)
        }
    }

    /// Lower-cased names of the provenance headers.
    pub fn provenance_headers(&self) -> Vec<String> {
        let p = &self.policy.provenance;
        [&p.subject_header, &p.agent_header, &p.tool_header, &p.session_header]
            .iter()
            .map(|h| h.to_ascii_lowercase())
            .collect()
    }

    fn validate_policy(&self, errs: &mut Vec<ConfigError>) {
        let p = &self.policy;
        if p.roles.is_empty() {
            errs.push(ConfigError::new("policy.roles", "must list at least one role"));
        }
        let mut seen = BTreeSet::new();
        for r in &p.roles {
            if r.trim().is_empty() || !seen.insert(r.as_str()) {
                errs.push(ConfigError::new(
                    "policy.roles",
                    format!("roles must be unique and non-empty (`{r}`)"),
                ));
            }
        }
        if let Some(store) = &p.rate_limit.store {
            let r = &store.redis;
            if let Err(e) = crate::check_redis_url(&r.url) {
                errs.push(ConfigError::new("policy.rateLimit.store.redis.url", e));
            }
            if !(1..=1000).contains(&r.timeout_ms) {
                errs.push(ConfigError::new(
                    "policy.rateLimit.store.redis.timeoutMs",
                    "must be 1-1000: a store slower than that costs every call its wait",
                ));
            }
            if r.key_prefix.len() > 64 || r.key_prefix.bytes().any(|b| !b.is_ascii_graphic()) {
                errs.push(ConfigError::new(
                    "policy.rateLimit.store.redis.keyPrefix",
                    "must be at most 64 visible ASCII characters",
                ));
            }
            for (key, f) in [("passwordFile", &r.password_file), ("caFile", &r.ca_file)] {
                if f.as_deref().is_some_and(str::is_empty) {
                    errs.push(ConfigError::new(
                        format!("policy.rateLimit.store.redis.{key}"),
                        "must be a file path",
                    ));
                }
            }
        }
        let a = &p.auth;
        use crate::AuthMode;
        if matches!(a.mode, AuthMode::Bearer | AuthMode::ApiKey | AuthMode::CustomHeaders)
            && a.credentials_file.is_none()
        {
            errs.push(ConfigError::new(
                "policy.auth.credentialsFile",
                "is required for bearer, apiKey and customHeaders modes (a file from a mounted Secret)",
            ));
        }
        if !a.api_key_header.bytes().all(is_token_byte) || a.api_key_header.is_empty() {
            errs.push(ConfigError::new(
                "policy.auth.apiKeyHeader",
                "is not a valid HTTP header name",
            ));
        }
        if a.mode == AuthMode::CustomHeaders && a.custom_headers.is_empty() {
            errs.push(ConfigError::new(
                "policy.auth.customHeaders",
                "must name at least one header in customHeaders mode",
            ));
        }
        for (i, h) in a.custom_headers.iter().enumerate() {
            if h.is_empty() || !h.bytes().all(is_token_byte) {
                errs.push(ConfigError::new(
                    format!("policy.auth.customHeaders[{i}]"),
                    "is not a valid HTTP header name",
                ));
            }
        }
        match (&a.oauth, a.mode) {
            (None, AuthMode::Oauth) => errs.push(ConfigError::new("policy.auth.oauth", "is required in oauth mode")),
            (Some(o), _) => {
                if o.jwks_file.is_none() == o.jwks_url.is_none() {
                    errs.push(ConfigError::new(
                        "policy.auth.oauth",
                        "set exactly one of jwksFile and jwksUrl",
                    ));
                }
                // The jwksUrl scheme rule (https except to loopback) and tokenTypes live beside
                // the oauth settings, so `check`, a reload and the proxy's start agree.
                errs.extend(o.problems());
                if !(o.resource.starts_with("https://") || o.resource.starts_with("http://")) {
                    errs.push(ConfigError::new(
                        "policy.auth.oauth.resource",
                        "must be this endpoint's absolute URL, e.g. https://mcp.example.com/mcp",
                    ));
                }
                if o.issuer.trim().is_empty() {
                    errs.push(ConfigError::new("policy.auth.oauth.issuer", "must not be empty"));
                }
                if o.algorithms.is_empty() {
                    errs.push(ConfigError::new(
                        "policy.auth.oauth.algorithms",
                        "must list at least one algorithm",
                    ));
                }
                for alg in &o.algorithms {
                    if !crate::SUPPORTED_ALGORITHMS.contains(&alg.as_str()) {
                        errs.push(ConfigError::new(
                            "policy.auth.oauth.algorithms",
                            format!(
                                "`{alg}` is not supported (use {})",
                                crate::SUPPORTED_ALGORITHMS.join(", ")
                            ),
                        ));
                    }
                }
                for (scope, role) in &o.scope_roles {
                    if !p.roles.contains(role) {
                        errs.push(ConfigError::new(
                            format!("policy.auth.oauth.scopeRoles.{scope}"),
                            format!("`{role}` is not one of policy.roles"),
                        ));
                    }
                }
                if let Some(role) = &o.default_role {
                    if !p.roles.contains(role) {
                        errs.push(ConfigError::new(
                            "policy.auth.oauth.defaultRole",
                            format!("`{role}` is not one of policy.roles"),
                        ));
                    }
                }
            }
            (None, _) => {}
        }
        let rl = &p.rate_limit;
        for (i, c) in rl.trusted_proxies.iter().enumerate() {
            if let Err(e) = c.parse::<crate::Cidr>() {
                errs.push(ConfigError::new(format!("policy.rateLimit.trustedProxies[{i}]"), e));
            }
        }
        for name in rl.per_tool.keys() {
            if !self.tools.iter().any(|t| &t.name == name) {
                errs.push(ConfigError::new(
                    format!("policy.rateLimit.perTool.{name}"),
                    "names no tool in this config",
                ));
            }
        }
        let au = &p.audit;
        if au.sink == crate::AuditSink::File && au.path.as_deref().is_none_or(str::is_empty) {
            errs.push(ConfigError::new("policy.audit.path", "is required when sink is file"));
        }
        if au.buffer_size == 0 {
            errs.push(ConfigError::new("policy.audit.bufferSize", "must be at least 1"));
        }
        for (i, ptr) in au.redact_arguments.iter().enumerate() {
            if let Err(e) = Pointer::parse(ptr) {
                errs.push(ConfigError::new(format!("policy.audit.redactArguments[{i}]"), e));
            }
        }
        let pv = &p.provenance;
        let mut names = BTreeSet::new();
        for (key, h) in [
            ("subjectHeader", &pv.subject_header),
            ("agentHeader", &pv.agent_header),
            ("toolHeader", &pv.tool_header),
            ("sessionHeader", &pv.session_header),
        ] {
            let lower = h.to_ascii_lowercase();
            if h.is_empty() || !h.bytes().all(is_token_byte) || RESERVED_HEADERS.contains(&lower.as_str()) {
                errs.push(ConfigError::new(
                    format!("policy.provenance.{key}"),
                    format!("`{h}` cannot be used as a header name"),
                ));
            }
            if !names.insert(lower) {
                errs.push(ConfigError::new(
                    format!("policy.provenance.{key}"),
                    format!("`{h}` is used twice"),
                ));
            }
        }
        if let Some(c) = &self.upstream.credential {
            let lower = c.header.to_ascii_lowercase();
            if c.header.is_empty() || !c.header.bytes().all(is_token_byte) || RESERVED_HEADERS.contains(&lower.as_str())
            {
                errs.push(ConfigError::new(
                    "upstream.credential.header",
                    format!("`{}` cannot be used as a header name", c.header),
                ));
            }
            if c.file.is_empty() {
                errs.push(ConfigError::new("upstream.credential.file", "must name a file"));
            }
        }
    }

    fn validate_server(&self, errs: &mut Vec<ConfigError>) {
        let s = &self.server;
        let listen = check_addr(&s.listen, "server.listen", errs);
        let admin = check_addr(&s.admin_listen, "server.adminListen", errs);
        if let (Some(a), Some(b)) = (listen, admin) {
            if a == b && a.port() != 0 {
                errs.push(ConfigError::new("server.adminListen", "must differ from server.listen"));
            }
        }
        if let Some(m) = &s.metrics_listen {
            if let Some(m) = check_addr(m, "server.metricsListen", errs) {
                if m.port() != 0 && [listen, admin].contains(&Some(m)) {
                    errs.push(ConfigError::new(
                        "server.metricsListen",
                        "must differ from server.listen and server.adminListen",
                    ));
                }
            }
        }
        if s.admin_token_file.as_deref().is_some_and(str::is_empty) {
            errs.push(ConfigError::new("server.adminTokenFile", "must be a file path"));
        }
        if s.session_key_file.as_deref().is_some_and(str::is_empty) {
            errs.push(ConfigError::new("server.sessionKeyFile", "must be a file path"));
        }
        if s.session_ttl_seconds == 0 {
            errs.push(ConfigError::new("server.sessionTtlSeconds", "must be at least 1"));
        }
        if !s.path.starts_with('/') || s.path.contains(['?', '#', ' ']) {
            errs.push(ConfigError::new(
                "server.path",
                format!("`{}` must be an absolute path such as `/mcp`", s.path),
            ));
        }
        for (i, origin) in s.allowed_origins.iter().enumerate() {
            if let Err(e) = check_origin(origin) {
                errs.push(ConfigError::new(format!("server.allowedOrigins[{i}]"), e));
            }
        }
        for (i, host) in s.allowed_hosts.iter().enumerate() {
            if host.is_empty() || host.contains(['/', ' ', '@']) || (host.contains(':') && !host.starts_with('[')) {
                errs.push(ConfigError::new(
                    format!("server.allowedHosts[{i}]"),
                    format!("`{host}` is not a host name: use `mcp.example.com`, `10.0.0.7` or `[::1]` without a port"),
                ));
            }
        }
        if s.max_body_bytes == 0 || s.max_body_bytes > MAX_BODY_LIMIT {
            errs.push(ConfigError::new(
                "server.maxBodyBytes",
                format!("must be between 1 and {MAX_BODY_LIMIT}"),
            ));
        }
        if s.shutdown_delay_seconds > 60 {
            errs.push(ConfigError::new("server.shutdownDelaySeconds", "must be at most 60"));
        }
        if s.session_ttl_seconds == 0 {
            errs.push(ConfigError::new("server.sessionTtlSeconds", "must be at least 1"));
        }
        if s.max_connections == 0 {
            errs.push(ConfigError::new("server.maxConnections", "must be at least 1"));
        }
        if s.max_connections_per_ip == 0 {
            errs.push(ConfigError::new("server.maxConnectionsPerIp", "must be at least 1"));
        }
        if s.max_sessions == 0 {
            errs.push(ConfigError::new("server.maxSessions", "must be at least 1"));
        }
        if s.listen_keep_alive_seconds == 0 || s.listen_keep_alive_seconds > 300 {
            errs.push(ConfigError::new("server.listenKeepAliveSeconds", "must be 1-300"));
        }
        if s.max_listeners_per_identity > s.max_listeners {
            errs.push(ConfigError::new(
                "server.maxListenersPerIdentity",
                "must not exceed server.maxListeners",
            ));
        }
        if s.page_size == 0 || s.page_size > 1000 {
            errs.push(ConfigError::new("server.pageSize", "must be between 1 and 1000"));
        }
        if s.name.trim().is_empty() {
            errs.push(ConfigError::new("server.name", "must not be empty"));
        }
    }

    fn validate_upstream(&self, errs: &mut Vec<ConfigError>) {
        let u = &self.upstream;
        if let Err(e) = check_base_url(&u.base_url) {
            errs.push(ConfigError::new("upstream.baseUrl", e));
        }
        check_timeout(u.timeout_ms, "upstream.timeoutMs", errs);
        check_timeout(u.connect_timeout_ms, "upstream.connectTimeoutMs", errs);
        if u.max_response_bytes == 0 {
            errs.push(ConfigError::new("upstream.maxResponseBytes", "must be at least 1"));
        }
    }
}

fn check_addr(text: &str, path: &str, errs: &mut Vec<ConfigError>) -> Option<SocketAddr> {
    match text.parse::<SocketAddr>() {
        Ok(a) => Some(a),
        Err(_) => {
            errs.push(ConfigError::new(
                path,
                format!("`{text}` is not an `ip:port` address (for example 127.0.0.1:8931)"),
            ));
            None
        }
    }
}

fn check_timeout(ms: u64, path: &str, errs: &mut Vec<ConfigError>) {
    if ms == 0 || ms > MAX_TOOL_TIMEOUT_MS {
        errs.push(ConfigError::new(
            path,
            format!(
                "{ms} ms is out of range: use 1..={MAX_TOOL_TIMEOUT_MS} (clients give up on tools/call after 30 s)"
            ),
        ));
    }
}

fn check_origin(origin: &str) -> Result<(), String> {
    if origin == "*" {
        return Ok(());
    }
    let (scheme, rest) = origin
        .split_once("://")
        .ok_or_else(|| format!("`{origin}` is not an origin: use `scheme://host[:port]` or `*`"))?;
    if !matches!(scheme, "http" | "https") || rest.is_empty() || rest.contains(['/', '?', '#', ' ']) {
        return Err(format!(
            "`{origin}` is not an origin: use `http(s)://host[:port]` without a path"
        ));
    }
    Ok(())
}

/// `upstream.baseUrl`: structurally a service URL (see [`crate::BaseUrl`]), and `http://`, the
/// only scheme the proxy's upstream client speaks.
fn check_base_url(url: &str) -> Result<(), String> {
    let parsed = crate::BaseUrl::parse(url)?;
    if parsed.scheme != "http" {
        return Err(format!(
            "`{url}`: https:// upstreams are not supported; the proxy speaks plain http to a loopback sidecar port or an in-cluster Service (use `http://host:port[/prefix]`)"
        ));
    }
    Ok(())
}

/// Whether `b` may appear in an HTTP header name (RFC 9110 `tchar`).
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}
