//! A loaded config compiled for serving: schemas compiled once, templates parsed, status maps
//! indexed, `tools/list` entries rendered. Swapped atomically on reload.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

// Keys the config chose (tool names, status codes), looked up on every call: foldhash.
use foldhash::{HashMap, HashMapExt};
use serde_json::{json, Value};
use toolgate_config::pointer::Pointer;
use toolgate_config::schema::{self, LazyValidator, LazyValidators};
use toolgate_config::{BodyMapping, BodyMode, ProxyConfig, Safety, StatusMapping, Template, Tier, ToolConfig};

use crate::envelope;
use crate::policy::auth::{read_ref, Authenticator};
use crate::policy::ratelimit::Rate;
use crate::upstream::pick::Pick;
use crate::upstream::{Upstream, UpstreamError};

/// A config that cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// The document itself is invalid.
    #[error("{0}")]
    Invalid(#[from] toolgate_config::LoadError),
    /// The upstream client could not be built.
    #[error("upstream: {0}")]
    Upstream(#[from] UpstreamError),
}

/// Which arguments travel in the body.
#[derive(Debug, Clone)]
pub enum BodyPlan {
    /// No body.
    None,
    /// Every argument except `used` (taken by the path, query or headers), limited to the
    /// declared properties when the schema does not explicitly admit others.
    AllExcept {
        /// Arguments already placed elsewhere.
        used: HashSet<String>,
        /// The declared properties, when only they may travel.
        only: Option<HashSet<String>>,
    },
    /// Exactly these arguments, each named once, in this order.
    Fields(Vec<String>),
    /// This argument's value is the whole body.
    Argument(String),
}

/// One tool, ready to serve.
pub struct CompiledTool {
    /// The tool as configured, less what lives on compiled in the fields below or rendered in
    /// `listing`, so that a 1,000-tool config does not keep it twice: `inputSchema` (`Null`),
    /// `outputSchema` (`None`), the description, title and semantic contract (empty), and
    /// `http.query`, `http.headers` and `response` (empty). What the policy and the call read
    /// (name, method, path, tier, safety, annotations, role, timeout) stays.
    pub config: ToolConfig,
    /// Effective tier.
    pub tier: Tier,
    /// Effective safety class.
    pub safety: Safety,
    /// `inputSchema`, checked at load and compiled on the tool's first call (shared with the
    /// tools whose schema is identical).
    pub input: Arc<LazyValidator>,
    /// `inputSchema` uses `$ref` (its violations can cost more than its size says: validated off
    /// the workers).
    pub input_has_refs: bool,
    /// `outputSchema`, if any (compiled on its first use and shared likewise).
    pub output: Option<Arc<LazyValidator>>,
    /// Parsed path template.
    pub path: Template,
    /// Parsed query templates.
    pub query: Vec<(String, Template)>,
    /// Parsed header templates.
    pub headers: Vec<(http::HeaderName, Template)>,
    /// Body plan.
    pub body: BodyPlan,
    /// Upstream timeout for one call.
    pub timeout: Duration,
    /// `response.pick`.
    pub pick: Pick,
    /// `response.errorPick`.
    pub error_pick: Pick,
    /// `response.redact`.
    pub redact: Vec<Pointer>,
    /// `response.evidence`.
    pub evidence: Vec<(String, Pointer)>,
    /// Exact-status overrides.
    pub statuses: HashMap<u16, StatusMapping>,
    /// Class overrides, indexed by the first digit; empty when the tool has none (most do not,
    /// and six inline mappings were a third of each compiled tool's size).
    pub classes: Box<[Option<StatusMapping>]>,
    /// The `tools/list` entry, as JSON text: a page is these joined, with no value tree kept
    /// per tool (the envelope's output schema alone is dozens of maps).
    pub listing: envelope::Listing,
}

/// The compiled, immutable serving state of one config generation.
pub struct Runtime {
    /// The config as loaded, but for `tools`: each tool's config moved into its
    /// [`CompiledTool::config`] (one copy, not two).
    pub config: ProxyConfig,
    /// Tools in `tools/list` order.
    pub tools: Vec<CompiledTool>,
    index: HashMap<String, usize>,
    /// Monotonic config generation (1 for the first config).
    pub generation: u64,
    /// The HTTP client for this generation's upstream.
    pub upstream: Upstream,
    /// Lower-cased allowed origins.
    pub allowed_origins: Vec<String>,
    /// Lower-cased allowed `Host` names; `None` accepts any host.
    pub allowed_hosts: Option<Vec<String>>,
    /// Authentication of this generation.
    pub auth: Authenticator,
    /// Effective rate limits.
    pub limits: Limits,
    /// Proxies whose `X-Forwarded-For` is believed.
    pub trusted_proxies: Vec<toolgate_config::Cidr>,
    /// Provenance header names.
    pub provenance: ProvenanceHeaders,
    /// The credential sent upstream (from its own file), marked sensitive.
    pub upstream_credential: Option<(http::HeaderName, http::HeaderValue)>,
    /// Files the config references (credentials, JWKS, upstream credential): a change to any of
    /// them reloads the config.
    pub files: Vec<String>,
    /// Fingerprint of those files' contents when this generation was compiled.
    pub files_fingerprint: [u8; 32],
    /// [`config_digest`] of the whole config this generation was compiled from (`config` no
    /// longer holds its tools): a reload of the same config is no change.
    pub config_digest: [u8; 32],
    /// SHA-256 of the token `PUT /loglevel` requires (`server.adminTokenFile`); `None` refuses it.
    pub admin_token: Option<[u8; 32]>,
    /// What every 2026-07-28 tool result starts with (`resultType`, the server's identity).
    pub modern_result_head: String,
    /// Keys sealing session ids (`server.sessionKeyFile`); `None`: sessions in memory.
    pub session_keys: Option<std::sync::Arc<crate::mcp::sealed::SessionKeys>>,
    /// The shared store (`policy.rateLimit.store`), its files read.
    pub store: Option<crate::store::StoreSettings>,
}

/// The value of `r`, or `None` with its problems added to `problems`.
fn take<T>(problems: &mut Vec<toolgate_config::ConfigError>, r: Result<Option<T>, CompileError>) -> Option<T> {
    match r {
        Ok(v) => v,
        Err(CompileError::Invalid(e)) => {
            problems.extend(e.errors);
            None
        }
        Err(e) => {
            problems.push(toolgate_config::ConfigError::new("", e.to_string()));
            None
        }
    }
}

/// Shortest accepted admin token.
pub const MIN_ADMIN_TOKEN_CHARS: usize = 16;

/// SHA-256 over the paths and contents of `files` (a missing file counts as empty).
pub fn fingerprint(files: &[String]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for f in files {
        h.update(f.as_bytes());
        h.update([0]);
        h.update(std::fs::read(f).unwrap_or_default());
        h.update([0]);
    }
    h.finalize().into()
}

/// SHA-256 of a config's canonical JSON (its serde form: key order and defaults as loaded).
pub fn config_digest(config: &ProxyConfig) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    Sha256::digest(serde_json::to_vec(config).unwrap_or_default()).into()
}

/// Effective limits of one generation.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Per client IP, before authentication.
    pub per_ip: Rate,
    /// Per identity, `tools/call`.
    pub per_identity: Rate,
    /// Per identity and tool.
    pub per_tool: HashMap<String, Rate>,
    /// Keys per limiter.
    pub max_keys: usize,
}

/// Provenance header names, parsed.
#[derive(Debug, Clone)]
pub struct ProvenanceHeaders {
    /// Subject.
    pub subject: http::HeaderName,
    /// Agent.
    pub agent: http::HeaderName,
    /// Tool.
    pub tool: http::HeaderName,
    /// Session.
    pub session: http::HeaderName,
    /// Client header naming the agent, believed from trusted proxies only.
    pub trusted_agent: Option<http::HeaderName>,
}

impl Runtime {
    /// Validates and compiles `config`.
    pub fn compile(mut config: ProxyConfig, generation: u64) -> Result<Self, CompileError> {
        // Validating compiles every schema, which refuses a bad one now; those validators are
        // dropped, and each tool's is compiled again on its first call (`LazyValidator`).
        config.validate().map_err(toolgate_config::LoadError::from)?;
        let mut schemas = LazyValidators::default();
        let upstream = Upstream::new(&config.upstream)?;
        let digest = config_digest(&config);
        let configs = std::mem::take(&mut config.tools);
        let mut tools = Vec::with_capacity(configs.len());
        let mut index = HashMap::with_capacity(configs.len());
        for (i, t) in configs.into_iter().enumerate() {
            let name = t.name.clone();
            let compiled = compile_tool(t, &mut schemas, config.upstream.timeout_ms).map_err(|(key, msg)| {
                toolgate_config::LoadError::from(vec![toolgate_config::ConfigError::new(
                    format!("tools[{i}] ({name}).{key}"),
                    msg,
                )])
            })?;
            index.insert(name, i);
            tools.push(compiled);
        }
        let allowed_origins = config
            .server
            .allowed_origins
            .iter()
            .map(|o| o.to_ascii_lowercase())
            .collect();
        let loopback = config
            .server
            .listen
            .parse::<std::net::SocketAddr>()
            .is_ok_and(|a| a.ip().is_loopback());
        let allowed_hosts = if !config.server.allowed_hosts.is_empty() {
            Some(
                config
                    .server
                    .allowed_hosts
                    .iter()
                    .map(|h| h.to_ascii_lowercase())
                    .collect(),
            )
        } else if loopback {
            Some(vec!["localhost".into(), "127.0.0.1".into(), "[::1]".into()])
        } else {
            None
        };
        let policy_error = |path: &str, msg: String| {
            CompileError::Invalid(toolgate_config::LoadError::from(vec![
                toolgate_config::ConfigError::new(path, msg),
            ]))
        };
        let mut files: Vec<String> = Vec::new();
        let a = &config.policy.auth;
        files.extend(a.credentials_file.clone());
        files.extend(a.oauth.as_ref().and_then(|o| o.jwks_file.clone()));
        files.extend(config.upstream.credential.as_ref().map(|c| c.file.clone()));
        files.extend(config.server.admin_token_file.clone());
        files.extend(config.server.session_key_file.clone());
        if let Some(r) = config.policy.rate_limit.store.as_ref().map(|s| &s.redis) {
            files.extend(r.password_file.clone());
            files.extend(r.ca_file.clone());
        }
        // Taken before the files are read: a change racing with this compile reloads once more.
        let files_fingerprint = fingerprint(&files);
        // Every file the config references is read here, and every problem with them reported
        // at once (`toolgate-proxy check` runs this too).
        let mut problems: Vec<toolgate_config::ConfigError> = Vec::new();
        let auth = match Authenticator::new(&config.policy, &config.server.name) {
            Ok(a) => Some(a),
            Err(es) => {
                problems.extend(es.into_iter().map(|e| toolgate_config::ConfigError::new("", e)));
                None
            }
        };
        let (resolved, warnings) = config.resolved_limits();
        for w in warnings {
            tracing::warn!(setting = %w, "rate limit setting unusable; default used");
        }
        let limits = Limits {
            per_ip: resolved.per_ip.into(),
            per_identity: resolved.per_identity.into(),
            per_tool: resolved.per_tool.into_iter().map(|(k, v)| (k, v.into())).collect(),
            max_keys: resolved.max_keys,
        };
        let trusted_proxies = config
            .policy
            .rate_limit
            .trusted_proxies
            .iter()
            .filter_map(|c| c.parse().ok())
            .collect();
        let pv = &config.policy.provenance;
        let name = |h: &str| {
            http::HeaderName::from_bytes(h.as_bytes())
                .map_err(|_| policy_error("policy.provenance", format!("`{h}` is not a header name")))
        };
        let provenance = ProvenanceHeaders {
            subject: name(&pv.subject_header)?,
            agent: name(&pv.agent_header)?,
            tool: name(&pv.tool_header)?,
            session: name(&pv.session_header)?,
            trusted_agent: pv.trusted_agent_header.as_deref().map(name).transpose()?,
        };
        let upstream_credential = take(
            &mut problems,
            config.upstream.credential.as_ref().map_or(Ok(None), |c| {
                let secret = read_ref(&c.file, "upstream.credential.file")
                    .map_err(|e| policy_error("upstream.credential.file", e))?;
                let value = format!("{}{}", c.prefix.as_deref().unwrap_or(""), secret.trim());
                let mut v = http::HeaderValue::from_str(&value).map_err(|_| {
                    policy_error(
                        "upstream.credential.file",
                        "the credential contains characters not allowed in a header".into(),
                    )
                })?;
                v.set_sensitive(true);
                Ok(Some((name(&c.header)?, v)))
            }),
        );
        let admin_token = take(
            &mut problems,
            config.server.admin_token_file.as_ref().map_or(Ok(None), |f| {
                let token =
                    read_ref(f, "server.adminTokenFile").map_err(|e| policy_error("server.adminTokenFile", e))?;
                let token = token.trim();
                if token.len() < MIN_ADMIN_TOKEN_CHARS {
                    return Err(policy_error(
                        "server.adminTokenFile",
                        format!("the token must be at least {MIN_ADMIN_TOKEN_CHARS} characters"),
                    ));
                }
                Ok(Some(crate::policy::credentials::digest(token.as_bytes())))
            }),
        );
        let session_keys = take(
            &mut problems,
            config.server.session_key_file.as_ref().map_or(Ok(None), |f| {
                let text =
                    read_ref(f, "server.sessionKeyFile").map_err(|e| policy_error("server.sessionKeyFile", e))?;
                let keys = crate::mcp::sealed::SessionKeys::parse(&text)
                    .map_err(|e| policy_error("server.sessionKeyFile", format!("{f}: {e}")))?;
                Ok(Some(std::sync::Arc::new(keys)))
            }),
        );
        let store = take(
            &mut problems,
            config.policy.rate_limit.store.as_ref().map_or(Ok(None), |st| {
                let r = &st.redis;
                let key = "policy.rateLimit.store.redis";
                let password = match &r.password_file {
                    Some(f) => Some(
                        read_ref(f, "policy.rateLimit.store.redis.passwordFile")
                            .map_err(|e| policy_error(&format!("{key}.passwordFile"), e))?
                            .trim()
                            .to_string(),
                    ),
                    None => None,
                };
                let ca = match &r.ca_file {
                    Some(f) => Some(
                        std::fs::read(f).map_err(|e| policy_error(&format!("{key}.caFile"), format!("{f}: {e}")))?,
                    ),
                    None => None,
                };
                redis::IntoConnectionInfo::into_connection_info(r.url.as_str())
                    .map_err(|e| policy_error(&format!("{key}.url"), e.to_string()))?;
                Ok(Some(crate::store::StoreSettings {
                    config: r.clone(),
                    password,
                    ca,
                }))
            }),
        );
        let Some(auth) = auth.filter(|_| problems.is_empty()) else {
            return Err(CompileError::Invalid(problems.into()));
        };
        if store.is_some() && session_keys.is_none() {
            tracing::warn!("policy.rateLimit.store is set but server.sessionKeyFile is not: 2025-era sessions stay in each replica's memory");
        }
        Ok(Self {
            session_keys,
            store,
            modern_result_head: crate::mcp::modern::result_head(&config.server.name),
            admin_token,
            config,
            tools,
            index,
            generation,
            upstream,
            allowed_origins,
            allowed_hosts,
            auth,
            limits,
            trusted_proxies,
            provenance,
            upstream_credential,
            files,
            files_fingerprint,
            config_digest: digest,
        })
    }

    /// The position of tool `name` in `tools`.
    pub fn tool_index(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
    }

    /// The tool called `name`.
    pub fn tool(&self, name: &str) -> Option<&CompiledTool> {
        self.index.get(name).map(|&i| &self.tools[i])
    }
}

fn compile_tool(
    mut t: ToolConfig,
    schemas: &mut LazyValidators,
    default_timeout_ms: u64,
) -> Result<CompiledTool, (&'static str, String)> {
    let input = schemas.get(&t.input_schema);
    let output = t.output_schema.as_ref().map(|s| schemas.get(s));
    let path = Template::parse(&t.http.path).map_err(|e| ("http.path", e.to_string()))?;
    let mut used: HashSet<String> = path.vars().map(str::to_string).collect();
    // The query, headers and response settings are compiled into the fields below and the
    // description, title and contract rendered into `listing`: none of them is kept twice.
    let (query_config, headers_config) = (std::mem::take(&mut t.http.query), std::mem::take(&mut t.http.headers));
    let response = std::mem::take(&mut t.response);
    let mut query = Vec::with_capacity(query_config.len());
    for (k, v) in &query_config {
        let tpl = Template::parse(v).map_err(|e| ("http.query", e.to_string()))?;
        used.extend(tpl.vars().map(str::to_string));
        query.push((k.clone(), tpl));
    }
    let mut headers = Vec::with_capacity(headers_config.len());
    for (k, v) in &headers_config {
        let name = http::HeaderName::from_bytes(k.as_bytes()).map_err(|e| ("http.headers", e.to_string()))?;
        let tpl = Template::parse(v).map_err(|e| ("http.headers", e.to_string()))?;
        used.extend(tpl.vars().map(str::to_string));
        headers.push((name, tpl));
    }
    let body = match t.effective_body() {
        BodyMapping::Mode(BodyMode::None) => BodyPlan::None,
        BodyMapping::Mode(BodyMode::All) => BodyPlan::AllExcept {
            used,
            only: declared_only(&t.input_schema),
        },
        BodyMapping::Fields(mut f) => {
            // A field named twice travels once, where it was first named.
            let mut seen = HashSet::new();
            f.retain(|name| seen.insert(name.clone()));
            BodyPlan::Fields(f)
        }
        BodyMapping::Argument(a) => BodyPlan::Argument(a.argument),
    };
    let pointers = |list: &[String]| -> Result<Vec<Pointer>, (&'static str, String)> {
        list.iter()
            .map(|p| Pointer::parse(p).map_err(|e| ("response", e)))
            .collect()
    };
    let mut statuses = HashMap::new();
    let mut classes: Vec<Option<StatusMapping>> = Vec::new();
    for (key, mapping) in &response.statuses {
        if let Some(class) = key.strip_suffix("xx") {
            let d: usize = class
                .parse()
                .map_err(|_| ("response.statuses", format!("bad key `{key}`")))?;
            if classes.is_empty() {
                classes.resize(6, None);
            }
            let slot = classes
                .get_mut(d)
                .ok_or_else(|| ("response.statuses", format!("bad key `{key}`")))?;
            *slot = Some(mapping.clone());
        } else {
            let code: u16 = key
                .parse()
                .map_err(|_| ("response.statuses", format!("bad key `{key}`")))?;
            statuses.insert(code, mapping.clone());
        }
    }
    let tier = t.effective_tier();
    let safety = t.effective_safety();
    let listing = listing(&t);
    let input_has_refs = schema::has_refs(&t.input_schema);
    // Kept as text in `input`/`output` and rendered into `listing`: the value trees are not kept.
    t.input_schema = Value::Null;
    t.output_schema = None;
    t.description = String::new();
    t.title = None;
    t.contract = Default::default();
    Ok(CompiledTool {
        tier,
        safety,
        input_has_refs,
        input,
        output,
        path,
        query,
        headers,
        body,
        timeout: Duration::from_millis(t.http.timeout_ms.unwrap_or(default_timeout_ms)),
        pick: Pick::new(pointers(&response.pick)?),
        error_pick: Pick::new(pointers(&response.error_pick)?),
        redact: pointers(&response.redact)?,
        evidence: response
            .evidence
            .iter()
            .map(|p| {
                Pointer::parse(p)
                    .map(|ptr| (p.clone(), ptr))
                    .map_err(|e| ("response.evidence", e))
            })
            .collect::<Result<_, _>>()?,
        statuses,
        classes: classes.into_boxed_slice(),
        listing,
        config: t,
    })
}

/// The declared properties, unless the schema explicitly admits undeclared ones
/// (`additionalProperties` other than `false`, or `patternProperties`): an argument the schema
/// never named does not reach the upstream just because the schema forgot to forbid it.
fn declared_only(schema: &Value) -> Option<HashSet<String>> {
    let props = schema.get("properties")?.as_object()?;
    let explicit_extra = schema
        .get("additionalProperties")
        .is_some_and(|a| a != &Value::Bool(false))
        || schema.get("patternProperties").is_some();
    (!explicit_extra).then(|| props.keys().cloned().collect())
}

/// The tool's `tools/list` entry, written as JSON text member by member around the output
/// schema, which [`envelope::Listing`] shares between tools.
fn listing(t: &ToolConfig) -> envelope::Listing {
    /// Appends `,"key":value`.
    fn member(out: &mut String, key: &str, value: &impl serde::Serialize) {
        out.push_str(",\"");
        out.push_str(key);
        out.push_str("\":");
        out.push_str(&serde_json::to_string(value).unwrap_or_else(|_| "null".into()));
    }
    let a = t.effective_annotations();
    let mut annotations = json!({
        "readOnlyHint": a.read_only_hint,
        "destructiveHint": a.destructive_hint,
        "idempotentHint": a.idempotent_hint,
        "openWorldHint": a.open_world_hint,
    });
    let mut before = format!("{{\"name\":{}", Value::from(t.name.as_str()));
    member(&mut before, "description", &t.published_description());
    member(&mut before, "inputSchema", &t.input_schema);
    let mut after = String::new();
    if let Some(title) = &t.title {
        member(&mut after, "title", title);
        annotations["title"] = json!(title);
    }
    member(&mut after, "annotations", &annotations);
    after.push('}');
    envelope::Listing::new(&t.name, &before, t.output_schema.as_ref(), &after)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_is_the_entry_tools_list_publishes() {
        let text = "apiVersion: toolgate.dev/v1alpha1\nkind: ProxyConfig\nupstream: {baseUrl: 'http://127.0.0.1:9'}\ntools:\n  \
            - {name: plain, description: Reads, inputSchema: {type: object}, http: {method: GET, path: /a}}\n  \
            - {name: titled, title: 'A \"titled\" one', description: Writes, inputSchema: {type: object, properties: {n: {type: integer}}}, \
               outputSchema: {type: object}, http: {method: POST, path: /b}}\n";
        let rt = Runtime::compile(toolgate_config::parse_yaml(text).unwrap(), 1).unwrap();
        for (t, keys) in [
            (
                "plain",
                vec!["name", "description", "inputSchema", "outputSchema", "annotations"],
            ),
            (
                "titled",
                vec![
                    "name",
                    "description",
                    "inputSchema",
                    "outputSchema",
                    "title",
                    "annotations",
                ],
            ),
        ] {
            let tool = rt.tool(t).unwrap();
            let mut out = String::new();
            tool.listing.write(&mut out);
            let entry: serde_json::Map<String, Value> = serde_json::from_str(&out).unwrap();
            assert_eq!(entry.keys().map(String::as_str).collect::<Vec<_>>(), keys, "{out}");
            assert_eq!(entry["name"], t);
            assert_eq!(entry["outputSchema"]["properties"]["toolName"]["const"], t);
            assert_eq!(entry["annotations"]["readOnlyHint"], t == "plain");
        }
        let mut out = String::new();
        let titled = rt.tool("titled").unwrap();
        titled.listing.write(&mut out);
        let entry: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(entry["description"], "Writes");
        assert!(
            titled.config.description.is_empty() && titled.config.title.is_none(),
            "what the listing holds is not kept twice"
        );
        assert_eq!(entry["title"], "A \"titled\" one");
        assert_eq!(entry["annotations"]["title"], "A \"titled\" one");
        assert_eq!(entry["inputSchema"]["properties"]["n"]["type"], "integer");
        assert!(
            entry["outputSchema"]["then"].is_object(),
            "its own outputSchema holds `data`"
        );
    }
}
