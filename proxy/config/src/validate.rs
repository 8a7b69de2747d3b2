//! Whole-document checks that serde cannot express. Every problem is collected; nothing
//! stops at the first one.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;

use serde_json::Value;

use crate::pointer::Pointer;
use crate::{BodyMapping, ConfigError, ProxyConfig, Template, ToolConfig, API_VERSION, KIND, MAX_TOOL_TIMEOUT_MS};

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

/// Each tool's compiled `inputSchema` and `outputSchema`, in the order of `tools`.
pub type CompiledSchemas = Vec<(jsonschema::Validator, Option<jsonschema::Validator>)>;

impl ProxyConfig {
    /// Checks everything serde cannot: versions, addresses, URLs, tool names, schemas,
    /// mappings and pointers. Returns every problem found.
    pub fn validate(&self) -> Result<(), Vec<ConfigError>> {
        self.validate_and_compile().map(drop)
    }

    /// [`ProxyConfig::validate`], keeping the schemas it compiled to check them, so a loader
    /// compiles each once.
    pub fn validate_and_compile(&self) -> Result<CompiledSchemas, Vec<ConfigError>> {
        let mut errs = Vec::new();
        let mut compiled = Vec::with_capacity(self.tools.len());
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
        let patterns = crate::schema::Patterns::default();
        for (i, tool) in self.tools.iter().enumerate() {
            let at = format!("tools[{i}] ({})", tool.name);
            if let Some(first) = seen.insert(&tool.name, i) {
                seen.insert(&tool.name, first);
                errs.push(ConfigError::new(
                    format!("{at}.name"),
                    format!("duplicate tool name `{}` (first declared at tools[{first}])", tool.name),
                ));
            }
            compiled.extend(validate_tool(tool, &at, &patterns, &mut errs));
            if let Some(role) = &tool.required_role {
                if !self.policy.roles.contains(role) {
                    errs.push(ConfigError::new(
                        format!("{at}.requiredRole"),
                        format!("`{role}` is not one of policy.roles ({})", self.policy.roles.join(", ")),
                    ));
                }
            }
            let provenance = self.provenance_headers();
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
            Ok(compiled)
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

/// Whether `name` is a valid MCP tool name: 1-128 of `A-Z a-z 0-9 _ - .`.
pub fn is_valid_tool_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// Checks `tool`; its compiled schemas when they compile.
fn validate_tool(
    tool: &ToolConfig,
    at: &str,
    patterns: &crate::schema::Patterns,
    errs: &mut Vec<ConfigError>,
) -> Option<(jsonschema::Validator, Option<jsonschema::Validator>)> {
    if !is_valid_tool_name(&tool.name) {
        errs.push(ConfigError::new(
            format!("{at}.name"),
            "must be 1-128 characters of letters, digits, `_`, `-` or `.`",
        ));
    }
    let (declared, input) = check_schema(&tool.input_schema, &format!("{at}.inputSchema"), patterns, errs).unzip();
    let output = tool
        .output_schema
        .as_ref()
        .map(|out| check_schema(out, &format!("{at}.outputSchema"), patterns, errs).map(|(_, v)| v));
    if tool.effective_tier() == crate::Tier::Read {
        use crate::Method;
        let method = tool.http.method.as_str();
        if matches!(tool.http.method, Method::Put | Method::Patch | Method::Delete) {
            errs.push(ConfigError::new(
                format!("{at}.tier"),
                format!(
                    "{method} can never be a read-tier tool: PUT, PATCH and DELETE change state, and read-tier tools are open to every role on a read-only server; set `tier: write`, or map the read to GET or HEAD (or to POST with `safety: read_only` for a query that takes a body)"
                ),
            ));
        } else if tool.effective_safety() != crate::Safety::ReadOnly {
            errs.push(ConfigError::new(
                format!("{at}.tier"),
                format!(
                    "a read-tier tool must be safe: {method} with safety `{}` would be served in read-only mode; set `safety: read_only` for a read over POST, or `tier: write`",
                    tool.effective_safety().as_str()
                ),
            ));
        }
    }
    if let Some(role) = &tool.required_role {
        if role.trim().is_empty() {
            errs.push(ConfigError::new(
                format!("{at}.requiredRole"),
                "must not be empty when set",
            ));
        }
    }
    let required: BTreeSet<&str> = tool
        .input_schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let check_vars = |template: &Template, path: String, errs: &mut Vec<ConfigError>| {
        if let Some(props) = &declared {
            for var in template.vars() {
                if !props.contains(var) {
                    errs.push(ConfigError::new(
                        path.clone(),
                        format!("placeholder `{{{var}}}` is not a property declared in inputSchema.properties"),
                    ));
                }
            }
        }
    };

    let http = &tool.http;
    let path_at = format!("{at}.http.path");
    match Template::parse(&http.path) {
        Err(e) => errs.push(ConfigError::new(path_at, e.to_string())),
        Ok(t) => {
            if !http.path.starts_with('/') {
                errs.push(ConfigError::new(path_at.clone(), "must start with `/`"));
            } else if http.path.starts_with("//") {
                errs.push(ConfigError::new(
                    path_at.clone(),
                    "must start with a single `/` (`//host/...` reads as a host to some servers)",
                ));
            }
            for lit in t.literals() {
                if lit.contains(['?', '#', '\\']) || !lit.bytes().all(|b| b.is_ascii_graphic()) {
                    errs.push(ConfigError::new(
                        path_at.clone(),
                        "must be a plain ASCII path without `?`, `#`, `\\`, spaces or control characters (put query parameters under `http.query`)",
                    ));
                    break;
                }
            }
            if http.path.split('/').any(|seg| seg == ".." || seg == ".") {
                errs.push(ConfigError::new(
                    path_at.clone(),
                    "must not contain `.` or `..` segments",
                ));
            }
            check_vars(&t, path_at.clone(), errs);
            for var in t.vars() {
                if declared.as_ref().is_some_and(|d| d.contains(var)) && !required.contains(var) {
                    errs.push(ConfigError::new(
                        path_at.clone(),
                        format!("placeholder `{{{var}}}` must be listed in inputSchema.required (a path segment cannot be left out)"),
                    ));
                }
            }
        }
    }
    for (name, value) in &http.query {
        let p = format!("{at}.http.query.{name}");
        if name.is_empty() {
            errs.push(ConfigError::new(p.clone(), "query parameter names must not be empty"));
        }
        match Template::parse(value) {
            Ok(t) => check_vars(&t, p, errs),
            Err(e) => errs.push(ConfigError::new(p, e.to_string())),
        }
    }
    for (name, value) in &http.headers {
        let p = format!("{at}.http.headers.{name}");
        let lower = name.to_ascii_lowercase();
        if name.is_empty() || !name.bytes().all(is_token_byte) {
            errs.push(ConfigError::new(p.clone(), "is not a valid HTTP header name"));
        } else if RESERVED_HEADERS.contains(&lower.as_str()) || lower.starts_with("x-toolgate-") {
            errs.push(ConfigError::new(
                p.clone(),
                format!("`{name}` is set by the proxy and cannot be configured"),
            ));
        }
        if value.contains(['\r', '\n', '\0']) {
            errs.push(ConfigError::new(
                p.clone(),
                "header values must not contain CR, LF or NUL",
            ));
        }
        match Template::parse(value) {
            Ok(t) => check_vars(&t, p, errs),
            Err(e) => errs.push(ConfigError::new(p, e.to_string())),
        }
    }
    if let Some(BodyMapping::Argument(a)) = &http.body {
        if declared
            .as_ref()
            .is_some_and(|props| !props.contains(a.argument.as_str()))
        {
            errs.push(ConfigError::new(
                format!("{at}.http.body.argument"),
                format!("`{}` is not a property declared in inputSchema.properties", a.argument),
            ));
        }
    }
    if let Some(BodyMapping::Fields(fields)) = &http.body {
        let p = format!("{at}.http.body");
        if let Some(props) = &declared {
            for f in fields {
                if !props.contains(f.as_str()) {
                    errs.push(ConfigError::new(
                        p.clone(),
                        format!("`{f}` is not a property declared in inputSchema.properties"),
                    ));
                }
            }
        }
    }
    if http.body.is_some() && http.method.is_read() && tool.effective_body() != BodyMapping::Mode(crate::BodyMode::None)
    {
        errs.push(ConfigError::new(
            format!("{at}.http.body"),
            format!("{} requests cannot carry a body", http.method.as_str()),
        ));
    }
    if let Some(ms) = http.timeout_ms {
        check_timeout(ms, &format!("{at}.http.timeoutMs"), errs);
    }

    let r = &tool.response;
    for (key, list) in [
        ("pick", &r.pick),
        ("errorPick", &r.error_pick),
        ("redact", &r.redact),
        ("evidence", &r.evidence),
    ] {
        for (i, ptr) in list.iter().enumerate() {
            match Pointer::parse(ptr) {
                Err(e) => errs.push(ConfigError::new(format!("{at}.response.{key}[{i}]"), e)),
                Ok(p) if p.tokens.is_empty() && key != "evidence" => errs.push(ConfigError::new(
                    format!("{at}.response.{key}[{i}]"),
                    "the empty pointer names the whole body; name a field such as `/id`",
                )),
                Ok(_) => {}
            }
        }
    }
    for key in r.statuses.keys() {
        if !is_status_key(key) {
            errs.push(ConfigError::new(
                format!("{at}.response.statuses.{key}"),
                "keys are HTTP statuses (`404`) or classes (`4xx`) between 100 and 599",
            ));
        }
    }
    match output {
        None => Some((input?, None)),
        Some(out) => Some((input?, Some(out?))),
    }
}

fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn is_status_key(key: &str) -> bool {
    let b = key.as_bytes();
    if b.len() != 3 || !(b'1'..=b'5').contains(&b[0]) {
        return false;
    }
    (b[1].is_ascii_digit() && b[2].is_ascii_digit()) || (b[1] == b'x' && b[2] == b'x')
}

/// Checks that `schema` is an object schema that compiles; returns its declared property names
/// and the compiled validator.
fn check_schema(
    schema: &Value,
    at: &str,
    patterns: &crate::schema::Patterns,
    errs: &mut Vec<ConfigError>,
) -> Option<(BTreeSet<String>, jsonschema::Validator)> {
    let Some(obj) = schema.as_object() else {
        errs.push(ConfigError::new(at, "must be a JSON Schema object"));
        return None;
    };
    // `arguments` is an object, so an inputSchema's root must say so; an outputSchema describes
    // the envelope's `data`, which may be any JSON value (SEP-2106).
    if at.ends_with(".inputSchema") && obj.get("type").and_then(Value::as_str) != Some("object") {
        errs.push(ConfigError::new(
            at,
            format!(
                "the root must declare `type: object` (found {})",
                obj.get("type")
                    .map_or_else(|| "no type".to_string(), |t| format!("`{t}`"))
            ),
        ));
    }
    let validator = match crate::schema::compile(schema, patterns) {
        Ok(v) => v,
        Err(e) => {
            errs.push(ConfigError::new(at, format!("is not a valid JSON Schema: {e}")));
            return None;
        }
    };
    let declared = obj
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default();
    Some((declared, validator))
}

#[cfg(test)]
mod tests {
    use crate::parse_yaml;

    const BASE: &str =
        "apiVersion: toolgate.dev/v1alpha1\nkind: ProxyConfig\nupstream: {baseUrl: 'http://127.0.0.1:8080'}\n";

    fn errors(tools_yaml: &str) -> Vec<String> {
        parse_yaml(&format!("{BASE}tools:\n{tools_yaml}"))
            .unwrap_err()
            .errors
            .into_iter()
            .map(|e| e.to_string())
            .collect()
    }

    #[test]
    fn an_output_schema_may_have_any_root_but_an_input_schema_is_an_object() {
        let ok = parse_yaml(&format!(
            "{BASE}tools:\n  - {{name: t, inputSchema: {{type: object}}, outputSchema: {{type: array, items: {{type: string}}}}, http: {{method: GET, path: /x}}}}\n"
        ));
        assert!(ok.is_ok(), "{:?}", ok.err());
        let errs = errors("  - {name: t, inputSchema: {type: array}, http: {method: GET, path: /x}}\n");
        assert!(
            errs.iter()
                .any(|e| e.contains("inputSchema") && e.contains("type: object")),
            "{errs:?}"
        );
    }

    #[test]
    fn the_architecture_example_loads() {
        let text = include_str!("../../../example/architecture-example.yaml");
        let cfg = parse_yaml(text).unwrap();
        assert_eq!(cfg.tools[0].name, "get_customer");
        assert_eq!(
            cfg.tools[0].response.statuses["404"].message_es.as_deref(),
            Some("No encontré al cliente")
        );
    }

    #[test]
    fn unknown_keys_are_rejected_with_the_tool_named() {
        let e = errors("  - name: t\n    inputSchema: {type: object}\n    http: {method: GET, path: /x, methd: GET}\n");
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].starts_with("tools[0] (t).http"), "{e:?}");
        assert!(e[0].contains("unknown field `methd`"), "{e:?}");
    }

    #[test]
    fn root_type_must_be_object() {
        let e = errors("  - name: t\n    inputSchema: {type: string}\n    http: {method: GET, path: /x}\n");
        assert!(
            e[0].contains("tools[0] (t).inputSchema") && e[0].contains("type: object"),
            "{e:?}"
        );
    }

    #[test]
    fn invalid_schema_is_rejected() {
        let e = errors(
            "  - name: t\n    inputSchema: {type: object, properties: {a: {type: 12}}}\n    http: {method: GET, path: /x}\n",
        );
        assert!(e.iter().any(|e| e.contains("not a valid JSON Schema")), "{e:?}");
    }

    #[test]
    fn duplicate_names_and_every_problem_are_reported() {
        let e = errors(concat!(
            "  - name: t\n    inputSchema: {type: object}\n    http: {method: GET, path: /x}\n",
            "  - name: t\n    inputSchema: {type: object}\n    http: {method: GET, path: '/y/{id}', timeoutMs: 31000}\n",
        ));
        assert!(
            e.iter()
                .any(|e| e.contains("duplicate tool name `t` (first declared at tools[0])")),
            "{e:?}"
        );
        assert!(
            e.iter().any(|e| e.contains("placeholder `{id}` is not a property")),
            "{e:?}"
        );
        assert!(e.iter().any(|e| e.contains("tools[1] (t).http.timeoutMs")), "{e:?}");
    }

    #[test]
    fn path_placeholders_must_be_required_properties() {
        let e = errors(
            "  - name: t\n    inputSchema: {type: object, properties: {id: {type: string}}}\n    http: {method: GET, path: '/y/{id}'}\n",
        );
        assert!(e[0].contains("must be listed in inputSchema.required"), "{e:?}");
    }

    #[test]
    fn header_values_with_newlines_and_reserved_headers_are_rejected() {
        let e = errors(
            "  - name: t\n    inputSchema: {type: object}\n    http: {method: GET, path: /x, headers: {X-A: \"a\\r\\nb\", Host: evil}}\n",
        );
        assert!(e.iter().any(|e| e.contains("CR, LF")), "{e:?}");
        assert!(e.iter().any(|e| e.contains("`Host` is set by the proxy")), "{e:?}");
    }

    #[test]
    fn bad_pointers_and_status_keys_are_rejected() {
        let e = errors(
            "  - name: t\n    inputSchema: {type: object}\n    http: {method: GET, path: /x}\n    response: {pick: [id], statuses: {'600': {status: failed}, '4xx': {status: failed}}}\n",
        );
        assert!(e.iter().any(|e| e.contains("response.pick[0]")), "{e:?}");
        assert!(e.iter().any(|e| e.contains("statuses.600")), "{e:?}");
        assert_eq!(e.len(), 2, "{e:?}");
    }

    #[test]
    fn https_and_userinfo_upstreams_are_rejected() {
        let e = parse_yaml("apiVersion: toolgate.dev/v1alpha1\nkind: ProxyConfig\nupstream: {baseUrl: 'https://x'}\n")
            .unwrap_err();
        assert!(e.errors[0].to_string().starts_with("upstream.baseUrl"), "{e}");
    }

    #[test]
    fn wrong_api_version_is_reported() {
        let e = parse_yaml("apiVersion: v1\nkind: ProxyConfig\nupstream: {baseUrl: 'http://x:1'}\n").unwrap_err();
        assert!(e.errors[0].to_string().contains("toolgate.dev/v1alpha1"));
    }

    #[test]
    fn a_read_tier_tool_must_use_a_safe_method_and_be_safe() {
        // (method, tier, safety) -> None when accepted, or a fragment of the `.tier` error.
        let never = "can never be a read-tier tool";
        let unsafe_ = "a read-tier tool must be safe";
        for (method, tier, safety, expected) in [
            ("GET", "read", None, None),
            ("GET", "read", Some("read_only"), None),
            ("HEAD", "read", None, None),
            ("POST", "read", Some("read_only"), None),
            ("GET", "write", None, None),
            ("POST", "write", None, None),
            ("PUT", "write", Some("mutation"), None),
            ("DELETE", "write", None, None),
            ("POST", "read", None, Some(unsafe_)),
            ("POST", "read", Some("mutation"), Some(unsafe_)),
            ("GET", "read", Some("external_send"), Some(unsafe_)),
            ("PUT", "read", Some("read_only"), Some(never)),
            ("PUT", "read", None, Some(never)),
            ("PATCH", "read", Some("read_only"), Some(never)),
            ("DELETE", "read", Some("read_only"), Some(never)),
            ("DELETE", "read", None, Some(never)),
        ] {
            let safety = safety.map(|s| format!(", safety: {s}")).unwrap_or_default();
            let text = format!(
                "{BASE}tools:\n  - {{name: close, tier: {tier}{safety}, inputSchema: {{type: object}}, http: {{method: {method}, path: /accounts/close}}}}\n"
            );
            let case = format!("{method} tier {tier}{safety}");
            match (parse_yaml(&text), expected) {
                (Ok(_), None) => {}
                (Err(e), Some(needle)) => {
                    let e: Vec<String> = e.errors.iter().map(|e| e.to_string()).collect();
                    assert_eq!(e.len(), 1, "{case}: {e:?}");
                    assert!(e[0].starts_with("tools[0] (close).tier: "), "{case}: {e:?}");
                    assert!(e[0].contains(needle), "{case}: {e:?}");
                    assert!(e[0].contains("tier: write"), "{case}: says what to do: {e:?}");
                }
                (got, want) => panic!("{case}: expected {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn read_only_mode_serves_get_and_head_and_post_only_when_allowed() {
        let cfg = parse_yaml(&format!(
            "{BASE}tools:\n  - {{name: get, inputSchema: {{type: object}}, http: {{method: GET, path: /a}}}}\n  - {{name: head, inputSchema: {{type: object}}, http: {{method: HEAD, path: /a}}}}\n  - {{name: search, tier: read, safety: read_only, inputSchema: {{type: object}}, http: {{method: POST, path: /s}}}}\n  - {{name: post, inputSchema: {{type: object}}, http: {{method: POST, path: /p}}}}\n  - {{name: get_write, tier: write, inputSchema: {{type: object}}, http: {{method: GET, path: /g}}}}\n  - {{name: put, inputSchema: {{type: object}}, http: {{method: PUT, path: /u}}}}\n"
        ))
        .unwrap();
        assert!(cfg.policy.read_only && !cfg.policy.allow_read_over_post, "defaults");
        let served = |p: &crate::PolicyConfig| -> Vec<&str> {
            cfg.tools
                .iter()
                .filter(|t| p.serves(t))
                .map(|t| t.name.as_str())
                .collect()
        };
        let mut p = cfg.policy.clone();
        assert_eq!(served(&p), ["get", "head"]);
        p.allow_read_over_post = true;
        assert_eq!(served(&p), ["get", "head", "search"]);
        p.read_only = false;
        assert_eq!(served(&p).len(), 6);
        // A PUT that claims to be a safe read is still never served read-only (configs that skip
        // validation included).
        let mut put = cfg.tools[5].clone();
        put.tier = Some(crate::Tier::Read);
        put.safety = Some(crate::Safety::ReadOnly);
        assert!(!put.served_read_only(true));
    }

    #[test]
    fn allow_read_over_post_is_a_policy_key() {
        let cfg = parse_yaml(&format!("{BASE}policy: {{allowReadOverPost: true}}\n")).unwrap();
        assert!(cfg.policy.allow_read_over_post);
    }

    #[test]
    fn tool_paths_cannot_name_a_host_or_hide_characters() {
        for (path, needle) in [
            ("//evil.example/x", "single `/`"),
            ("/a\\\\b", "`\\`"),
            ("/a\tb", "control"),
        ] {
            let e = errors(&format!(
                "  - {{name: t, inputSchema: {{type: object}}, http: {{method: GET, path: \"{path}\"}}}}\n"
            ));
            assert!(
                e.iter()
                    .any(|e| e.starts_with("tools[0] (t).http.path") && e.contains(needle)),
                "{path}: {e:?}"
            );
        }
    }

    #[test]
    fn upstream_base_urls_are_checked_structurally() {
        let load = |url: &str| {
            let text = format!(
                "apiVersion: toolgate.dev/v1alpha1\nkind: ProxyConfig\nupstream: {{baseUrl: {}}}\n",
                serde_json::to_string(url).unwrap()
            );
            parse_yaml(&text).map(|_| ()).map_err(|e| {
                assert_eq!(e.errors.len(), 1, "{url}: {e}");
                e.errors[0].to_string()
            })
        };
        for ok in [
            "http://127.0.0.1:8080",
            "http://127.0.0.1:8080/",
            "http://shop-api.demo.svc:80",
            "http://shop-api.demo.svc.cluster.local:8080/api/v1/",
            "http://[::1]:9000/x",
            "http://localhost",
        ] {
            assert_eq!(load(ok), Ok(()), "{ok}");
        }
        for (bad, needle) in [
            ("http://127.0.0.1:38080/.demo.svc:80", "contains `:`"),
            ("http://admin@shop-api.demo.svc", "user info"),
            ("http://shop-api.demo.svc:80@127.0.0.1:38080", "user info"),
            ("http://shop-api/?x=1", "query"),
            ("http://shop-api/#x", "fragment"),
            ("http://shop-api/a/../b", "`..`"),
            ("http://shop-api/./b", "`.`"),
            ("http://%31%32%37.0.0.1", "percent-encoded"),
            ("http://evil\\@shop-api", "backslash"),
            ("http://shop api", "whitespace"),
            ("http://shop-api\n.demo", "whitespace"),
            ("http://:8080", "host"),
            ("http://127.1:8080", "dotted quad"),
            ("https://shop-api.demo.svc", "https:// upstreams are not supported"),
            ("ftp://shop-api", "scheme `ftp`"),
            ("shop-api.demo.svc:80", "scheme"),
        ] {
            let e = load(bad).expect_err(bad);
            assert!(e.starts_with("upstream.baseUrl: "), "{bad}: {e}");
            assert!(e.contains(needle), "{bad}: `{needle}` not in: {e}");
        }
    }

    #[test]
    fn policy_references_are_checked() {
        let text = format!(
            "{BASE}policy:\n  auth: {{mode: apiKey}}\n  rateLimit: {{perTool: {{nope: {{requests: 1}}}}, trustedProxies: [bad]}}\n  audit: {{sink: file}}\ntools:\n  - {{name: t, requiredRole: root, inputSchema: {{type: object}}, http: {{method: GET, path: /x, headers: {{X-Toolgate-Tool: x}}}}}}\n"
        );
        let e: Vec<String> = parse_yaml(&text)
            .unwrap_err()
            .errors
            .iter()
            .map(|e| e.to_string())
            .collect();
        for needle in [
            "policy.auth.credentialsFile",
            "policy.rateLimit.perTool.nope",
            "policy.rateLimit.trustedProxies[0]",
            "policy.audit.path",
            "tools[0] (t).requiredRole: `root` is not one of policy.roles",
            "tools[0] (t).http.headers.X-Toolgate-Tool",
        ] {
            assert!(e.iter().any(|e| e.contains(needle)), "{needle} missing in {e:#?}");
        }
    }

    #[test]
    fn unusable_limits_fall_back_to_defaults_with_warnings() {
        let text = format!(
            "{BASE}policy:\n  rateLimit:\n    perIp: {{requests: 0, windowSeconds: abc}}\n    perIdentity: {{requests: '30'}}\n    maxKeys: -5\n"
        );
        let cfg = parse_yaml(&text).unwrap();
        let (limits, warnings) = cfg.resolved_limits();
        assert_eq!((limits.per_ip.requests, limits.per_ip.window_seconds), (120, 60));
        assert_eq!(
            (limits.per_identity.requests, limits.per_identity.window_seconds),
            (30, 60)
        );
        assert_eq!(limits.max_keys, 50_000);
        assert_eq!(warnings.len(), 3, "{warnings:?}");
        assert!(warnings[0].contains("policy.rateLimit.perIp.requests"), "{warnings:?}");
    }

    #[test]
    fn unquoted_numeric_status_keys_work() {
        let cfg = parse_yaml(&format!(
            "{BASE}tools:\n  - name: t\n    inputSchema: {{type: object}}\n    http: {{method: GET, path: /x}}\n    response: {{statuses: {{404: {{status: needs_more_info}}}}}}\n"
        ))
        .unwrap();
        assert!(cfg.tools[0].response.statuses.contains_key("404"));
    }

    #[test]
    fn published_description_has_the_contract_in_order() {
        let cfg = parse_yaml(&format!(
            "{BASE}tools:\n  - name: t\n    description: Does X.\n    fallback: Ask.\n    whenToUse: When Y.\n    inputSchema: {{type: object}}\n    http: {{method: GET, path: /x}}\n"
        ))
        .unwrap();
        assert_eq!(
            cfg.tools[0].published_description(),
            "Does X.\n\nWhen to use:\nWhen Y.\n\nFallback:\nAsk."
        );
    }

    #[test]
    fn hints_tier_and_safety_follow_the_method() {
        let cfg = parse_yaml(&format!(
            "{BASE}tools:\n  - {{name: a, inputSchema: {{type: object}}, http: {{method: GET, path: /x}}}}\n  - {{name: b, inputSchema: {{type: object}}, http: {{method: DELETE, path: /x}}}}\n  - {{name: c, inputSchema: {{type: object}}, http: {{method: POST, path: /x}}, annotations: {{idempotentHint: true}}}}\n"
        ))
        .unwrap();
        let [a, b, c] = [&cfg.tools[0], &cfg.tools[1], &cfg.tools[2]];
        let (ha, hb, hc) = (
            a.effective_annotations(),
            b.effective_annotations(),
            c.effective_annotations(),
        );
        assert_eq!(
            (ha.read_only_hint, ha.idempotent_hint, ha.destructive_hint),
            (Some(true), Some(true), Some(false))
        );
        assert_eq!(
            (hb.read_only_hint, hb.idempotent_hint, hb.destructive_hint),
            (Some(false), Some(true), Some(true))
        );
        assert_eq!((hc.read_only_hint, hc.idempotent_hint), (Some(false), Some(true)));
        assert_eq!(a.effective_tier(), crate::Tier::Read);
        assert_eq!(b.effective_safety(), crate::Safety::Destructive);
        assert_eq!(c.effective_tier(), crate::Tier::Write);
    }
}
