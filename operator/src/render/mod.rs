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

/// How long a gateway proxy keeps serving after SIGTERM, with `/readyz` failing, before it
/// closes its listeners. A deleted pod leaves the Service's EndpointSlice at once, but every
/// node's kube-proxy (or other dataplane) drops it from its rules a little later; a listener
/// closed meanwhile refuses the calls still sent to it. Five seconds, as Istio's default
/// drain; the gateway pod's termination grace covers it ([`crate::objects::termination_grace_seconds`]).
/// A sidecar needs none: it is stopped only after the application's containers have exited,
/// which is later still.
pub const GATEWAY_SHUTDOWN_DELAY_SECONDS: u64 = 5;

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
        shutdown_delay_seconds: match spec.mode {
            ServerMode::Gateway => GATEWAY_SHUTDOWN_DELAY_SECONDS,
            ServerMode::Sidecar => 0,
        },
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
mod tests;
