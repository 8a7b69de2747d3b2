//! McpServer + McpTools → ProxyConfig: a pure function, no I/O. It decides which tools are
//! served (and why the others are not), where Secrets are mounted, and the ConfigMap text.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use toolgate_config::{BodyMapping, ConfigError, ProxyConfig, ServerConfig, Tier, ToolConfig, UpstreamConfig};

use crate::crd::{McpServer, McpTool, SecretKeyRef, ServerMode};
use crate::status::reason;

/// Key of the rendered config in the ConfigMap. JSON, not YAML: the proxy parses a
/// 1,000-tool config about twice as fast, with no YAML node budget to outgrow.
pub const CONFIG_KEY: &str = "proxy.json";
/// Where the ConfigMap is mounted in the proxy container.
pub const CONFIG_DIR: &str = "/etc/toolgate/config";
/// Secrets are mounted under this directory, one subdirectory per use.
pub const SECRETS_DIR: &str = "/etc/toolgate/secrets";

/// A Secret key the proxy reads from a file.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct SecretMount {
    /// Volume name (also the subdirectory under [`SECRETS_DIR`]).
    pub volume: &'static str,
    /// The Secret.
    pub secret: String,
    /// The key, projected as a file of the same name.
    pub key: String,
}

impl SecretMount {
    fn new(volume: &'static str, r: &SecretKeyRef) -> Self {
        Self {
            volume,
            secret: r.name.clone(),
            key: r.key.clone(),
        }
    }

    /// Directory the volume is mounted at.
    pub fn dir(&self) -> String {
        format!("{SECRETS_DIR}/{}", self.volume)
    }

    /// Path of the key's file in the proxy container.
    pub fn file(&self) -> String {
        format!("{}/{}", self.dir(), self.key)
    }
}

/// What happened to one McpTool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Served under this tier.
    Accepted {
        /// Effective tier.
        tier: Tier,
    },
    /// Not served.
    Rejected {
        /// Effective tier, when the tool got that far.
        tier: Option<Tier>,
        /// CamelCase reason (a constant of [`reason`]).
        reason: &'static str,
        /// What is wrong and what to fix.
        message: String,
    },
}

/// The outcome of rendering one McpServer.
#[derive(Debug, Clone)]
pub struct Rendered {
    /// The config, valid by construction when `problems` is empty.
    pub config: ProxyConfig,
    /// The ConfigMap text.
    pub text: String,
    /// SHA-256 of `text`, hex.
    pub hash: String,
    /// Secret keys to mount into the proxy.
    pub mounts: Vec<SecretMount>,
    /// One verdict per McpTool, keyed by the McpTool's `metadata.name`.
    pub verdicts: BTreeMap<String, Verdict>,
    /// Problems of the server's own settings; the config must not be applied when any.
    pub problems: Vec<String>,
}

/// The most a ConfigMap's data may hold (keys and values): the API server refuses more.
pub const MAX_CONFIGMAP_DATA: usize = 1 << 20;

impl Rendered {
    /// Why this config cannot be written to a ConfigMap, when it is too large for one.
    pub fn too_large(&self) -> Option<String> {
        let size = CONFIG_KEY.len() + self.text.len();
        (size > MAX_CONFIGMAP_DATA).then(|| {
            format!(
                "the rendered config of {} tools is {size} bytes, over the {MAX_CONFIGMAP_DATA} bytes a ConfigMap can hold: split the tools across McpServers (spec.toolSelector) or shorten their descriptions and schemas",
                self.config.tools.len()
            )
        })
    }
}

/// The ConfigMap text of `config`: indented JSON, each tool compact on its own line, so a
/// `kubectl get` stays readable and a changed tool is a changed line, at about the size of
/// YAML (indenting the tools too would double it, against the 1 MiB a ConfigMap holds).
fn config_text(config: &ProxyConfig) -> String {
    let mut value = serde_json::to_value(config).unwrap_or_default();
    let tools = value
        .as_object_mut()
        .and_then(|o| o.remove("tools"))
        .and_then(|t| match t {
            Value::Array(a) => Some(a),
            _ => None,
        })
        .unwrap_or_default();
    let head = serde_json::to_string_pretty(&value).unwrap_or_default();
    let mut text = head.trim_end().trim_end_matches('}').trim_end().to_string();
    text.push_str(",\n  \"tools\": [");
    for (i, t) in tools.iter().enumerate() {
        text.push_str(if i == 0 { "\n    " } else { ",\n    " });
        text.push_str(&serde_json::to_string(t).unwrap_or_default());
    }
    text.push_str(if tools.is_empty() { "]\n}\n" } else { "\n  ]\n}\n" });
    text
}

/// The in-cluster MCP URL of a server.
pub fn endpoint(server: &McpServer) -> String {
    format!(
        "http://{}.{}.svc:{}/mcp",
        service_name(server),
        server.metadata.namespace.as_deref().unwrap_or("default"),
        server.spec.port
    )
}

/// The URL of Service `name` in namespace `ns`: built from its parts, and only for a name
/// that is a Service name (a DNS-1035 label), so no spelling of `name` can make the host
/// anything but `<name>.<ns>.svc`.
pub fn service_url(name: &str, ns: &str, port: i32) -> Result<String, String> {
    if !crate::guard::is_dns1035_label(name) {
        return Err(format!(
            "spec.upstream.service.name: `{}` is not a Service name (a DNS-1035 label: lower-case letters, digits and '-', starting with a letter); the gateway only calls Services of its own namespace",
            name.escape_debug()
        ));
    }
    if !(1..=65535).contains(&port) {
        return Err(format!("spec.upstream.service.port: {port} is not a port (1-65535)"));
    }
    let url = format!("http://{name}.{ns}.svc:{port}");
    let authority = url
        .parse::<http::Uri>()
        .ok()
        .and_then(|u| u.authority().map(|a| (a.host().to_string(), a.port_u16())));
    if authority != Some((format!("{name}.{ns}.svc"), u16::try_from(port).ok())) {
        return Err(format!("spec.upstream.service: `{name}` does not make a Service URL"));
    }
    Ok(url)
}

/// `<server>-mcp`: the Service in front of the MCP port.
pub fn service_name(server: &McpServer) -> String {
    format!("{}-mcp", server.metadata.name.as_deref().unwrap_or_default())
}

/// `<server>-session-keys`: the Secret the operator keeps the session keys in.
pub fn session_secret_name(server: &McpServer) -> String {
    format!("{}-session-keys", server.metadata.name.as_deref().unwrap_or_default())
}

/// Key of the session keys in their Secret (one base64 key per line, the first sealing).
pub const SESSION_KEYS_KEY: &str = "keys";

/// `<server>-toolgate`: the ConfigMap holding the rendered ProxyConfig.
pub fn configmap_name(server: &McpServer) -> String {
    format!("{}-toolgate", server.metadata.name.as_deref().unwrap_or_default())
}

/// Renders `server` with the `tools` it selected (any order).
pub fn render(server: &McpServer, tools: &[McpTool]) -> Rendered {
    let spec = &server.spec;
    let ns = server.metadata.namespace.as_deref().unwrap_or("default");
    let name = server.metadata.name.as_deref().unwrap_or_default();
    let mut mounts = Vec::new();
    let mut problems = Vec::new();

    let mut upstream = UpstreamConfig::new(match (spec.mode, &spec.upstream.service) {
        (ServerMode::Gateway, Some(svc)) => match service_url(&svc.name, ns, svc.port) {
            Ok(url) => url,
            Err(e) => {
                problems.push(e);
                // Never used: a server with problems is not applied.
                "http://127.0.0.1:1".to_string()
            }
        },
        _ => format!("http://127.0.0.1:{}", spec.upstream.port.unwrap_or(80)),
    });
    if let Some(ms) = spec.upstream.connect_timeout_ms {
        upstream.connect_timeout_ms = ms;
    }
    if let Some(ms) = spec.upstream.timeout_ms {
        upstream.timeout_ms = ms;
    }
    if let Some(b) = spec.upstream.max_response_bytes {
        upstream.max_response_bytes = b;
    }
    if let Some(c) = &spec.upstream.credential {
        let m = SecretMount::new("upstream-credential", &c.secret_ref);
        upstream.credential = Some(toolgate_config::UpstreamCredential {
            header: c.header.clone(),
            file: m.file(),
            prefix: c.prefix.clone(),
        });
        mounts.push(m);
    }

    let sessions = spec.sessions.as_ref();
    let session_key_file = crate::crd::ServerSessions::sealed(sessions).then(|| {
        let m = SecretMount {
            volume: "session-keys",
            secret: session_secret_name(server),
            key: SESSION_KEYS_KEY.into(),
        };
        let file = m.file();
        mounts.push(m);
        file
    });
    let server_cfg = ServerConfig {
        session_ttl_seconds: crate::crd::ServerSessions::ttl_seconds(sessions),
        session_key_file,
        listen: format!("0.0.0.0:{}", spec.port),
        admin_listen: format!("0.0.0.0:{}", spec.admin_port),
        allowed_origins: spec.allowed_origins.clone(),
        allowed_hosts: spec.allowed_hosts.clone(),
        name: name.to_string(),
        instructions: spec.instructions.clone(),
        ..ServerConfig::default()
    };

    let policy_value = policy_json(server, &mut mounts);
    let policy = match serde_json::from_value(policy_value) {
        Ok(p) => p,
        Err(e) => {
            problems.push(format!("spec: {e}"));
            toolgate_config::PolicyConfig::default()
        }
    };

    if spec.auth.is_none() {
        problems.push(
            "spec.auth: required: set auth.mode (apiKey, bearer, customHeaders or oauth), or `mode: none` to serve every caller without authentication, as an anonymous caller with the lowest role".into(),
        );
    }
    let mut config = ProxyConfig::new(upstream, Vec::new());
    config.server = server_cfg;
    config.policy = policy;
    if let Err(errs) = config.validate() {
        problems.extend(errs.iter().map(|e| format!("{}: {}", spec_path(&e.path), e.message)));
    }

    // Oldest first, so the oldest tool keeps a contested name.
    let mut ordered: Vec<&McpTool> = tools.iter().collect();
    ordered.sort_by(|a, b| {
        let ka = (
            a.metadata.creation_timestamp.as_ref().map(|t| t.0),
            a.metadata.name.as_deref(),
        );
        let kb = (
            b.metadata.creation_timestamp.as_ref().map(|t| t.0),
            b.metadata.name.as_deref(),
        );
        ka.cmp(&kb)
    });
    let mut verdicts = BTreeMap::new();
    let mut owners: BTreeMap<String, String> = BTreeMap::new();
    for tool in ordered {
        let object = tool.metadata.name.clone().unwrap_or_default();
        let verdict = if spec.allowed_tools.is_empty() || spec.allowed_tools.contains(&object) {
            judge(&config, tool, &owners)
        } else {
            Verdict::Rejected {
                tier: None,
                reason: reason::NOT_ALLOWED,
                message: format!("McpServer {name} serves only the McpTools in its spec.allowedTools, and {object} is not one of them; the server's owner adds it there"),
            }
        };
        if let Verdict::Accepted { .. } = verdict {
            owners.insert(tool.tool_name().to_string(), object.clone());
            config.tools.push(tool_config(tool));
        }
        verdicts.insert(object, verdict);
    }
    config.tools.sort_by(|a, b| a.name.cmp(&b.name));
    mounts.sort();
    mounts.dedup();

    let text = config_text(&config);
    let hash = hex(&Sha256::digest(text.as_bytes()));
    Rendered {
        config,
        text,
        hash,
        mounts,
        verdicts,
        problems,
    }
}

fn judge(config: &ProxyConfig, tool: &McpTool, owners: &BTreeMap<String, String>) -> Verdict {
    let name = tool.tool_name();
    let candidate = tool_config(tool);
    let tier = Some(candidate.effective_tier());
    if let Some(owner) = owners.get(name) {
        return Verdict::Rejected {
            tier,
            reason: reason::NAME_CONFLICT,
            message: format!("tool name `{name}` is already served by McpTool {owner} (the oldest keeps it); rename one of them with spec.name"),
        };
    }
    let mut alone = config.clone();
    alone.tools = vec![candidate];
    if let Err(errs) = alone.validate() {
        let errs: Vec<&ConfigError> = errs.iter().filter(|e| e.path.starts_with("tools[")).collect();
        if !errs.is_empty() {
            let pick = |key: &str| errs.iter().any(|e| e.path.contains(key));
            let reason = if pick(".inputSchema") || pick(".outputSchema") {
                reason::INVALID_SCHEMA
            } else if pick(".requiredRole") {
                reason::UNKNOWN_ROLE
            } else {
                reason::INVALID_MAPPING
            };
            let message = errs
                .iter()
                .map(|e| format!("{}: {}", spec_path(&e.path), e.message))
                .collect::<Vec<_>>()
                .join("; ");
            return Verdict::Rejected { tier, reason, message };
        }
    }
    let tier = alone.tools[0].effective_tier();
    // The proxy's own rule, so a tool is Accepted exactly when the proxy serves it.
    if !config.policy.serves(&alone.tools[0]) {
        let server = config.server.name.as_str();
        let message = if tier == Tier::Write {
            format!("a write-tier tool is not served while McpServer {server} has readOnly: true; set spec.readOnly: false on the server to serve it")
        } else {
            format!("a read over POST is served by a read-only McpServer only when it sets spec.allowReadOverPost: true; McpServer {server} does not")
        };
        return Verdict::Rejected {
            tier: Some(tier),
            reason: reason::READ_ONLY_SERVER,
            message,
        };
    }
    Verdict::Accepted { tier }
}

/// `tools[0] (name).http.path` → `spec.http.path`; `policy.auth.x` → `spec.auth.x`.
fn spec_path(path: &str) -> String {
    if let Some(rest) = path.strip_prefix("tools[") {
        let rest = rest.split_once(')').map(|(_, r)| r).unwrap_or(rest);
        return format!("spec{rest}");
    }
    let rest = path.strip_prefix("policy.").unwrap_or(path);
    format!("spec.{rest}")
}

/// The ProxyConfig tool of an McpTool.
pub fn tool_config(tool: &McpTool) -> ToolConfig {
    let s = &tool.spec;
    ToolConfig {
        name: tool.tool_name().to_string(),
        title: s.title.clone(),
        description: s.description.clone(),
        contract: s.contract.clone(),
        input_schema: s.input_schema.clone(),
        output_schema: s.output_schema.clone(),
        annotations: s.annotations.clone(),
        tier: s.tier,
        required_role: s.required_role.clone(),
        safety: s.safety,
        http: toolgate_config::HttpMapping {
            method: s.http.method,
            path: s.http.path.clone(),
            query: s.http.query.clone(),
            headers: s.http.headers.clone(),
            body: s.http.body.as_ref().map(|b| match (&b.fields, b.mode, &b.argument) {
                (Some(fields), _, _) => BodyMapping::Fields(fields.clone()),
                (None, Some(mode), _) => BodyMapping::Mode(mode),
                (None, None, Some(argument)) => BodyMapping::Argument(toolgate_config::ArgumentBody {
                    argument: argument.clone(),
                }),
                (None, None, None) => BodyMapping::Mode(toolgate_config::BodyMode::None),
            }),
            timeout_ms: s.http.timeout_ms,
        },
        response: s.response.clone().unwrap_or_default(),
    }
}

/// The `policy` block as JSON, so ProxyConfig's own defaults fill what the spec leaves out.
fn policy_json(server: &McpServer, mounts: &mut Vec<SecretMount>) -> Value {
    let spec = &server.spec;
    let mut policy = Map::new();
    policy.insert("readOnly".into(), spec.read_only.into());
    if let Some(roles) = &spec.roles {
        policy.insert("roles".into(), json!(roles));
    }
    if spec.allow_read_over_post {
        policy.insert("allowReadOverPost".into(), true.into());
    }
    if let Some(a) = &spec.auth {
        let mut auth = Map::new();
        auth.insert("mode".into(), json!(a.mode));
        if let Some(h) = &a.api_key_header {
            auth.insert("apiKeyHeader".into(), h.as_str().into());
        }
        if !a.custom_headers.is_empty() {
            auth.insert("customHeaders".into(), json!(a.custom_headers));
        }
        if let Some(r) = &a.credentials_secret_ref {
            let m = SecretMount::new("auth-credentials", r);
            auth.insert("credentialsFile".into(), m.file().into());
            mounts.push(m);
        }
        if let Some(o) = &a.oauth {
            let mut oauth = Map::new();
            oauth.insert("issuer".into(), o.issuer.as_str().into());
            let resource = o.resource.clone().unwrap_or_else(|| endpoint(server));
            oauth.insert("resource".into(), resource.into());
            if let Some(url) = &o.jwks_url {
                oauth.insert("jwksUrl".into(), url.as_str().into());
            }
            if let Some(r) = &o.jwks_secret_ref {
                let m = SecretMount::new("oauth-jwks", r);
                oauth.insert("jwksFile".into(), m.file().into());
                mounts.push(m);
            }
            if !o.algorithms.is_empty() {
                oauth.insert("algorithms".into(), json!(o.algorithms));
            }
            if !o.token_types.is_empty() {
                oauth.insert("tokenTypes".into(), json!(o.token_types));
            }
            if let Some(l) = o.leeway_seconds {
                oauth.insert("leewaySeconds".into(), l.into());
            }
            if !o.scope_roles.is_empty() {
                oauth.insert("scopeRoles".into(), json!(o.scope_roles));
            }
            if let Some(r) = &o.default_role {
                oauth.insert("defaultRole".into(), r.as_str().into());
            }
            auth.insert("oauth".into(), oauth.into());
        }
        policy.insert("auth".into(), auth.into());
    }
    if let Some(r) = &spec.rate_limit {
        let mut rate_limit = json!(r);
        if let (Some(store), Some(obj)) = (&r.store, rate_limit.as_object_mut()) {
            let redis = &store.redis;
            let mut doc = Map::new();
            doc.insert("url".into(), redis.url.as_str().into());
            if let Some(u) = &redis.username {
                doc.insert("username".into(), u.as_str().into());
            }
            if let Some(p) = &redis.password_secret_ref {
                let m = SecretMount::new("store-password", p);
                doc.insert("passwordFile".into(), m.file().into());
                mounts.push(m);
            }
            if let Some(c) = &redis.ca_secret_ref {
                let m = SecretMount::new("store-ca", c);
                doc.insert("caFile".into(), m.file().into());
                mounts.push(m);
            }
            let prefix = redis.key_prefix.clone().unwrap_or_else(|| {
                format!(
                    "toolgate:{}:{}:",
                    server.metadata.namespace.as_deref().unwrap_or("default"),
                    server.metadata.name.as_deref().unwrap_or_default()
                )
            });
            doc.insert("keyPrefix".into(), prefix.into());
            if let Some(t) = redis.timeout_ms {
                doc.insert("timeoutMs".into(), t.into());
            }
            if let Some(f) = redis.failure_policy {
                doc.insert("failurePolicy".into(), json!(f));
            }
            obj.insert("store".into(), json!({"redis": doc}));
        }
        policy.insert("rateLimit".into(), rate_limit);
    }
    if let Some(a) = &spec.audit {
        let mut audit = serde_json::to_value(a).unwrap_or_default();
        audit["sink"] = "stdout".into();
        policy.insert("audit".into(), audit);
    }
    policy.into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{McpServer, McpTool};
    use serde_json::json;
    use toolgate_config::Method;

    fn rejected(r: &Rendered, object: &str) -> (&'static str, String) {
        match &r.verdicts[object] {
            Verdict::Rejected { reason, message, .. } => (reason, message.clone()),
            v => panic!("{object} should be rejected, got {v:?}"),
        }
    }

    fn shop() -> McpServer {
        McpServer::test("shop").writable().with(json!({
            "auth": {"mode": "apiKey", "credentialsSecretRef": {"name": "shop-keys", "key": "credentials.yaml"}},
            "upstream": {"timeoutMs": 5000, "credential": {"header": "Authorization", "prefix": "Bearer ", "secretRef": {"name": "shop-upstream", "key": "token"}}},
            "rateLimit": {"perIdentity": {"requests": 30, "windowSeconds": 60}, "trustedProxies": ["10.0.0.0/8"],
                          "store": {"redis": {"url": "rediss://redis.shop.svc:6380/2", "passwordSecretRef": {"name": "shop-redis", "key": "password"}, "failurePolicy": "failClosed"}}},
            "sessions": {"ttlSeconds": 7200},
            "audit": {"failurePolicy": "failClosed", "redactArguments": ["/card"]}
        }))
    }

    fn create_ticket() -> McpTool {
        McpTool::test("create_ticket").method(Method::Post).with(json!({
            "http": {"path": "/tickets"},
            "inputSchema": {"type": "object", "properties": {"subject": {"type": "string"}}, "required": ["subject"]}
        }))
    }

    #[test]
    fn rendered_config_matches_the_snapshot_and_loads_in_the_proxy() {
        let r = render(&shop(), &[create_ticket(), McpTool::test("get_customer")]);
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/snapshots/shop.proxy.json");
        if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
            std::fs::write(path, &r.text).unwrap();
        }
        let want = std::fs::read_to_string(path).expect("snapshot (UPDATE_SNAPSHOTS=1 writes it)");
        assert_eq!(r.text, want, "rendered config changed; review, then UPDATE_SNAPSHOTS=1");
        let loaded = toolgate_config::parse_text(&r.text).expect("the proxy loads it");
        loaded.validate().expect("and it validates");
        assert_eq!(loaded, r.config);
        let names: Vec<_> = loaded.tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["create_ticket", "get_customer"]);
    }

    #[test]
    fn the_config_text_is_json_with_one_line_per_tool_and_loads_with_no_tools_too() {
        for tools in [vec![], vec![create_ticket(), McpTool::test("get_customer")]] {
            let r = render(&shop(), &tools);
            let v: Value = serde_json::from_str(&r.text).expect("JSON");
            assert_eq!(v["tools"].as_array().map(Vec::len), Some(tools.len()));
            let lines = r.text.lines().filter(|l| l.starts_with("    {\"name\":")).count();
            assert_eq!(lines, tools.len(), "{}", r.text);
            assert_eq!(toolgate_config::parse_text(&r.text).expect("loads"), r.config);
        }
    }

    #[test]
    fn secrets_are_mounted_by_reference_never_copied() {
        let r = render(&shop(), &[]);
        assert_eq!(
            r.mounts
                .iter()
                .map(|m| (m.volume, m.secret.as_str(), m.file()))
                .collect::<Vec<_>>(),
            [
                (
                    "auth-credentials",
                    "shop-keys",
                    "/etc/toolgate/secrets/auth-credentials/credentials.yaml".to_string()
                ),
                (
                    "session-keys",
                    "shop-session-keys",
                    "/etc/toolgate/secrets/session-keys/keys".to_string()
                ),
                (
                    "store-password",
                    "shop-redis",
                    "/etc/toolgate/secrets/store-password/password".to_string()
                ),
                (
                    "upstream-credential",
                    "shop-upstream",
                    "/etc/toolgate/secrets/upstream-credential/token".to_string()
                ),
            ]
        );
        assert_eq!(
            r.config.policy.auth.credentials_file.as_deref(),
            Some("/etc/toolgate/secrets/auth-credentials/credentials.yaml")
        );
        assert!(
            !r.text.contains("shop-keys") && !r.text.contains("shop-upstream"),
            "{}",
            r.text
        );
    }

    #[test]
    fn a_config_past_the_configmap_limit_is_said_to_be_too_large() {
        let tools = |n: usize| -> Vec<McpTool> {
            (0..n)
                .map(|i| McpTool::test(&format!("tool-{i}")).with(json!({"description": "x".repeat(4096)})))
                .collect()
        };
        let small = render(&McpServer::test("shop"), &tools(10));
        assert!(small.problems.is_empty(), "{:?}", small.problems);
        assert_eq!(small.too_large(), None);
        let big = render(&McpServer::test("shop"), &tools(300));
        assert_eq!(big.config.tools.len(), 300);
        assert!(big.text.len() > MAX_CONFIGMAP_DATA);
        let message = big.too_large().expect("too large");
        assert!(
            message.contains("300 tools") && message.contains("1048576"),
            "{message}"
        );
    }

    #[test]
    fn one_bad_tool_is_rejected_and_the_others_are_served() {
        let bad =
            McpTool::test("broken").with_schema(json!({"type": "object", "properties": {"id": {"type": "strnig"}}}));
        let r = render(&McpServer::test("shop"), &[bad, McpTool::test("get_customer")]);
        let (reason, message) = rejected(&r, "broken");
        assert_eq!(reason, reason::INVALID_SCHEMA);
        assert!(message.starts_with("spec.inputSchema"), "{message}");
        assert_eq!(r.verdicts["get-customer"], Verdict::Accepted { tier: Tier::Read });
        assert_eq!(r.config.tools.len(), 1);
    }

    #[test]
    fn a_read_over_post_is_served_read_only_only_when_the_server_allows_it() {
        let search = McpTool::test("search").method(Method::Post).with(json!({
            "http": {"path": "/search"}, "tier": "read", "safety": "read_only"}));
        let r = render(&McpServer::test("shop"), std::slice::from_ref(&search));
        assert_eq!(rejected(&r, "search").0, reason::READ_ONLY_SERVER);
        let allowing = McpServer::test("shop").with(json!({"allowReadOverPost": true}));
        let r = render(&allowing, &[search]);
        assert_eq!(r.verdicts["search"], Verdict::Accepted { tier: Tier::Read });
        assert!(r.config.policy.allow_read_over_post);
    }

    #[test]
    fn serving_without_authentication_must_be_said() {
        let mut s = McpServer::test("shop");
        s.spec.auth = None;
        let r = render(&s, &[]);
        assert!(
            r.problems.iter().any(|p| p.starts_with("spec.auth: required")),
            "{:?}",
            r.problems
        );
        assert!(
            render(&McpServer::test("shop"), &[]).problems.is_empty(),
            "mode: none is said"
        );
    }

    #[test]
    fn a_gateway_upstream_is_a_service_of_its_namespace_whatever_the_name_says() {
        let gw = |name: &str| {
            McpServer::test("shop").with(json!({"mode": "Gateway", "workloadRef": null,
                "upstream": {"port": null, "service": {"name": name, "port": 80}}}))
        };
        let r = render(&gw("api"), &[]);
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        assert_eq!(r.config.upstream.base_url, "http://api.demo.svc:80");
        for hostile in [
            "127.0.0.1:38080/",
            "169.254.169.254:80/x",
            "vault.prod.svc.cluster.local:8200/",
            "a@b",
            "api.other",
        ] {
            let r = render(&gw(hostile), &[]);
            assert!(
                r.problems.iter().any(|p| p.starts_with("spec.upstream.service.name")),
                "{hostile}: {:?}",
                r.problems
            );
        }
    }

    #[test]
    fn a_server_can_serve_only_the_tools_its_owner_lists() {
        let s = McpServer::test("shop").with(json!({"allowedTools": ["get-customer"]}));
        let r = render(&s, &[McpTool::test("get_customer"), McpTool::test("drop_tables")]);
        assert_eq!(r.verdicts["get-customer"], Verdict::Accepted { tier: Tier::Read });
        let (reason, message) = rejected(&r, "drop-tables");
        assert_eq!(reason, reason::NOT_ALLOWED);
        assert!(message.contains("spec.allowedTools"), "{message}");
        assert_eq!(r.config.tools.len(), 1);
    }

    #[test]
    fn a_pattern_that_would_backtrack_is_an_invalid_schema() {
        let redos = McpTool::test("redos").with_schema(json!({"type": "object", "properties": {
            "items": {"type": "array", "items": {"type": "string", "pattern": "^(a*)*\\1b"}}}}));
        let r = render(&McpServer::test("shop"), &[redos]);
        let (reason, message) = rejected(&r, "redos");
        assert_eq!(reason, reason::INVALID_SCHEMA);
        assert!(message.contains("needs a backtracking regex engine"), "{message}");
        assert!(r.config.tools.is_empty());
    }

    #[test]
    fn a_placeholder_missing_from_the_schema_is_an_invalid_mapping() {
        let t = McpTool::test("get_order").with(json!({"http": {"path": "/orders/{orderId}"}}));
        let (reason, message) = rejected(&render(&McpServer::test("shop"), &[t]), "get-order");
        assert_eq!(reason, reason::INVALID_MAPPING);
        assert!(
            message.contains("spec.http.path") && message.contains("orderId"),
            "{message}"
        );
    }

    #[test]
    fn the_oldest_tool_keeps_a_contested_name() {
        let older = McpTool::test("lookup").object("lookup-b").created(100);
        let newer = McpTool::test("lookup").object("lookup-a").created(200);
        let r = render(&McpServer::test("shop"), &[newer, older]);
        assert_eq!(r.verdicts["lookup-b"], Verdict::Accepted { tier: Tier::Read });
        let (reason, message) = rejected(&r, "lookup-a");
        assert_eq!(reason, reason::NAME_CONFLICT);
        assert!(message.contains("lookup-b"), "{message}");
    }

    #[test]
    fn write_tools_are_not_served_by_a_read_only_server() {
        let r = render(&McpServer::test("shop"), &[create_ticket()]);
        let (reason, message) = rejected(&r, "create-ticket");
        assert_eq!(reason, reason::READ_ONLY_SERVER);
        assert!(message.contains("readOnly: false"), "{message}");
        assert!(r.config.tools.is_empty());
    }

    #[test]
    fn an_unknown_required_role_is_reported() {
        let t = McpTool::test("get_customer").with(json!({"requiredRole": "root"}));
        let (reason, message) = rejected(&render(&McpServer::test("shop"), &[t]), "get-customer");
        assert_eq!(reason, reason::UNKNOWN_ROLE);
        assert!(message.contains("spec.requiredRole"), "{message}");
    }

    #[test]
    fn gateway_mode_calls_the_service_by_its_cluster_name() {
        let s = McpServer::test("shop").with(json!({"mode": "Gateway", "workloadRef": null, "upstream": {"port": null, "service": {"name": "shop-api", "port": 80}}}));
        let r = render(&s, &[]);
        assert_eq!(r.config.upstream.base_url, "http://shop-api.demo.svc:80");
        assert_eq!(endpoint(&s), "http://shop-mcp.demo.svc:8931/mcp");
    }

    #[test]
    fn bad_server_settings_are_problems_not_a_config() {
        let s = McpServer::test("shop").with(json!({"rateLimit": {"trustedProxies": ["not-a-cidr"]}}));
        let r = render(&s, &[]);
        assert!(
            r.problems
                .iter()
                .any(|p| p.starts_with("spec.rateLimit.trustedProxies")),
            "{:?}",
            r.problems
        );
    }

    #[test]
    fn the_hash_follows_the_content() {
        let a = render(&McpServer::test("shop"), &[McpTool::test("get_customer")]);
        let b = render(&McpServer::test("shop"), &[McpTool::test("get_customer")]);
        let c = render(
            &McpServer::test("shop"),
            &[McpTool::test("get_customer").with(json!({"description": "changed"}))],
        );
        assert_eq!(a.hash, b.hash);
        assert_ne!(a.hash, c.hash);
        assert_eq!(a.hash.len(), 64);
    }
}
