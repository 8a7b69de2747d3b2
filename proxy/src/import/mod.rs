//! `toolgate-proxy import openapi SPEC`: one tool per OpenAPI operation, as McpTool resources or
//! a ProxyConfig, with a comment on every operation left out and why. The output depends only on
//! the spec and the options, so a re-import is a clean diff.

pub mod schema;
pub mod spec;
pub mod tools;

use serde_json::{json, Value};
use toolgate_config::{ProxyConfig, ToolConfig};

pub use tools::{Filter, Imported, Outcome};

/// What to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// McpTool resources (multi-document YAML), one per tool.
    #[default]
    McpTool,
    /// One ProxyConfig document.
    ProxyConfig,
}

/// The command's options.
#[derive(Debug, Clone)]
pub struct Options {
    /// The McpServer the tools belong to (`serverRef`), and the prefix of their names.
    pub server: String,
    /// `metadata.namespace` of the McpTools, when given.
    pub namespace: Option<String>,
    /// Which operations.
    pub filter: Filter,
    /// The output form.
    pub format: Format,
    /// `upstream.baseUrl` of a ProxyConfig (default: the spec's first `http://` server).
    pub base_url: Option<String>,
    /// Whether tools declare the 2xx response as `outputSchema` (the proxy then fails a call
    /// whose answer does not match it).
    pub output_schemas: bool,
    /// The spec's file name, for the header comment.
    pub source: String,
    /// Write a ProxyConfig as JSON (comments then go to [`Import::notes`] only).
    pub json: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            server: "api".into(),
            namespace: None,
            filter: Filter::default(),
            format: Format::McpTool,
            base_url: None,
            output_schemas: true,
            source: "openapi".into(),
            json: false,
        }
    }
}

/// The result of an import.
#[derive(Debug)]
pub struct Import {
    /// The document's title and version.
    pub title: String,
    /// Every admitted operation, in document order.
    pub operations: Vec<Imported>,
    /// The output text.
    pub text: String,
}

impl Import {
    /// Tools written.
    pub fn tools(&self) -> impl Iterator<Item = &ToolConfig> {
        self.operations.iter().filter_map(|o| match &o.outcome {
            Outcome::Tool(t, _) => Some(&**t),
            Outcome::Skipped(_) => None,
        })
    }

    /// Operations skipped, with their reasons.
    pub fn skipped(&self) -> impl Iterator<Item = (&Imported, &str)> {
        self.operations.iter().filter_map(|o| match &o.outcome {
            Outcome::Skipped(r) => Some((o, r.as_str())),
            Outcome::Tool(..) => None,
        })
    }
}

/// Parses a spec's text (JSON or YAML).
pub fn parse(text: &str) -> Result<Value, String> {
    if text.trim_start().starts_with('{') {
        return serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"));
    }
    toolgate_config::parse_yaml_value(text).map_err(|e| e.to_string())
}

const PLACEHOLDER_BASE_URL: &str = "http://127.0.0.1:8080";

fn base_url(spec: &spec::Spec, opts: &Options) -> (String, Option<String>) {
    if let Some(u) = &opts.base_url {
        return (u.clone(), None);
    }
    let usable = |u: &str| u.starts_with("http://") && !u.contains('{') && toolgate_config::BaseUrl::parse(u).is_ok();
    match &spec.server_url {
        Some(u) if usable(u) => (u.clone(), None),
        Some(u) => {
            // The service's own path prefix (`https://api.example.com/v2` → `/v2`) is kept.
            let rest = u.split_once("://").map_or(u.as_str(), |(_, r)| r);
            let path = if u.starts_with('/') {
                u.as_str()
            } else {
                rest.find('/').map_or("", |i| &rest[i..])
            };
            let path = path.trim_end_matches('/');
            let base = if path.contains('{') || !usable(&format!("{PLACEHOLDER_BASE_URL}{path}")) {
                PLACEHOLDER_BASE_URL.to_string()
            } else {
                format!("{PLACEHOLDER_BASE_URL}{path}")
            };
            let warning = format!(
                "the spec's server is {u}; set upstream.baseUrl to the service's in-cluster http:// address (now {base})"
            );
            (base, Some(warning))
        }
        None => (
            PLACEHOLDER_BASE_URL.into(),
            Some("the spec names no server; set upstream.baseUrl".into()),
        ),
    }
}

/// A config holding `tools`, for checking them the way the proxy will load them.
fn config_with(tools: Vec<ToolConfig>, base: &str) -> Result<ProxyConfig, String> {
    let doc = json!({
        "apiVersion": toolgate_config::API_VERSION,
        "kind": toolgate_config::KIND,
        "upstream": {"baseUrl": base},
        "tools": tools,
    });
    toolgate_config::from_value(doc).map_err(|e| e.to_string())
}

/// Refuses, as skipped, every tool the proxy would not load (a pattern that needs
/// backtracking, a schema the validator cannot compile), with the proxy's own message.
fn verify(operations: &mut [Imported]) {
    for op in operations.iter_mut() {
        let Outcome::Tool(tool, _) = &op.outcome else { continue };
        let checked = config_with(vec![(**tool).clone()], PLACEHOLDER_BASE_URL)
            .and_then(|cfg| crate::Runtime::compile(cfg, 1).map(|_| ()).map_err(|e| e.to_string()));
        if let Err(e) = checked {
            // "N problems" then one "  - key: message" line each.
            let problems: Vec<&str> = e.lines().filter_map(|l| l.trim().strip_prefix("- ")).collect();
            let why = if problems.is_empty() {
                e.trim().to_string()
            } else {
                problems.join("; ")
            };
            op.outcome = Outcome::Skipped(format!("the proxy would refuse the tool: {why}"));
        }
    }
}

/// A DNS-1123 name for an McpTool.
fn resource_name(server: &str, tool: &str) -> String {
    let raw = format!("{server}-{tool}").to_ascii_lowercase();
    let mut out = String::with_capacity(raw.len());
    for c in raw.chars() {
        let c = if c.is_ascii_alphanumeric() { c } else { '-' };
        if !(c == '-' && out.ends_with('-')) {
            out.push(c);
        }
    }
    let out: String = out.trim_matches('-').chars().take(253).collect();
    out.trim_end_matches('-').to_string()
}

/// A tool as written: without the empty `response` every tool would otherwise carry.
fn tool_value(tool: &ToolConfig) -> Value {
    let mut v = serde_json::to_value(tool).unwrap_or(Value::Null);
    if let Some(m) = v.as_object_mut() {
        if m.get("response")
            .is_some_and(|r| r.as_object().is_some_and(|r| r.is_empty()))
        {
            m.remove("response");
        }
    }
    v
}

/// The McpTool `spec` for a tool: the same fields, `http.body` in the resource's shape.
fn mcptool_spec(tool: &ToolConfig, server: &str) -> Value {
    let mut v = tool_value(tool);
    let m = v.as_object_mut().expect("a tool serializes to an object");
    if let Some(body) = m.get_mut("http").and_then(|h| h.get_mut("body")) {
        *body = match body.take() {
            Value::String(mode) => json!({"mode": mode}),
            Value::Array(fields) => json!({"fields": fields}),
            other => other,
        };
    }
    let mut spec = serde_json::Map::new();
    spec.insert("serverRef".into(), json!({"name": server}));
    spec.extend(std::mem::take(m));
    Value::Object(spec)
}

/// `description` and `title` texts with tabs expanded: a multi-line text is written as a YAML
/// block scalar, and a line that starts with a tab there is refused by some YAML parsers
/// (kubectl's among them). Prose loses nothing.
fn untab(v: &mut Value) {
    match v {
        Value::Object(m) => {
            for (k, child) in m.iter_mut() {
                match child {
                    Value::String(s) if (k == "description" || k == "title") && s.contains('\t') => {
                        *s = s.replace('\t', "    ");
                    }
                    _ => untab(child),
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(untab),
        _ => {}
    }
}

fn yaml(v: &Value) -> String {
    let mut v = v.clone();
    untab(&mut v);
    serde_saphyr::to_string(&v).unwrap_or_default()
}

/// `text` as YAML comment lines. Spec text (operationIds, paths, media types) reaches comments,
/// and YAML ends a line at CR, NEL, U+2028 and U+2029 as well as LF: each of those, and every
/// other control character, becomes a space, so no spec can close a comment and inject a
/// document or a key.
fn comment(text: &str) -> String {
    text.split('\n')
        .map(|l| {
            let clean: String = l
                .chars()
                .map(|c| {
                    if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}') {
                        ' '
                    } else {
                        c
                    }
                })
                .collect();
            format!("# {clean}\n")
        })
        .collect()
}

/// Imports `doc` (the spec as JSON).
pub fn import(doc: Value, opts: &Options) -> Result<Import, String> {
    let spec = spec::read(doc)?;
    let mut operations = tools::import(&spec, &opts.filter, opts.output_schemas);
    verify(&mut operations);
    let title = format!("{} {}", spec.title, spec.api_version);
    let version = match spec.version {
        spec::Version::V30 => "3.0",
        spec::Version::V31 => "3.1",
    };
    let tools = operations
        .iter()
        .filter(|o| matches!(o.outcome, Outcome::Tool(..)))
        .count();
    let mut text = comment(&format!(
        "Generated by `toolgate-proxy import openapi` from {} ({title}, OpenAPI {version}).\n{tools} tools from {} operations; {} skipped, each with its reason below. Re-run to update.",
        opts.source,
        operations.len(),
        operations.len() - tools
    ));
    let route_comment = |o: &Imported| match &o.operation_id {
        Some(id) => format!("{} ({id})", o.route),
        None => o.route.clone(),
    };
    match opts.format {
        Format::McpTool => {
            let mut names = std::collections::HashSet::new();
            for o in &operations {
                match &o.outcome {
                    Outcome::Skipped(reason) => {
                        text.push_str(&comment(&format!("skipped {}: {reason}", route_comment(o))))
                    }
                    Outcome::Tool(tool, notes) => {
                        let base = resource_name(&opts.server, &tool.name);
                        let mut name = base.clone();
                        let mut n = 2;
                        while !names.insert(name.clone()) {
                            name = format!("{}-{n}", base.chars().take(248).collect::<String>());
                            n += 1;
                        }
                        let mut metadata = json!({"name": name});
                        if let Some(ns) = &opts.namespace {
                            metadata["namespace"] = json!(ns);
                        }
                        let doc = json!({
                            "apiVersion": toolgate_config::API_VERSION,
                            "kind": "McpTool",
                            "metadata": metadata,
                            "spec": mcptool_spec(tool, &opts.server),
                        });
                        text.push_str("---\n");
                        text.push_str(&comment(&route_comment(o)));
                        for note in notes {
                            text.push_str(&comment(&format!("note: {note}")));
                        }
                        text.push_str(&yaml(&doc));
                    }
                }
            }
        }
        Format::ProxyConfig => {
            let (base, warning) = base_url(&spec, opts);
            if let Some(w) = warning {
                text.push_str(&comment(&format!("note: {w}")));
            }
            for o in &operations {
                match &o.outcome {
                    Outcome::Skipped(reason) => {
                        text.push_str(&comment(&format!("skipped {}: {reason}", route_comment(o))))
                    }
                    Outcome::Tool(tool, notes) => {
                        for note in notes {
                            text.push_str(&comment(&format!("note on {}: {note}", tool.name)));
                        }
                    }
                }
            }
            let tools: Vec<Value> = operations
                .iter()
                .filter_map(|o| match &o.outcome {
                    Outcome::Tool(t, _) => Some(tool_value(t)),
                    Outcome::Skipped(_) => None,
                })
                .collect();
            let doc = json!({
                "apiVersion": toolgate_config::API_VERSION,
                "kind": toolgate_config::KIND,
                "upstream": {"baseUrl": base},
                "tools": tools,
            });
            if opts.json {
                // JSON has no comments: what they say is printed to stderr by the command.
                text = serde_json::to_string_pretty(&doc).unwrap_or_default();
                text.push('\n');
            } else {
                text.push_str(&yaml(&doc));
            }
        }
    }
    Ok(Import {
        title,
        operations,
        text,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_cannot_end_early() {
        let c = comment("x\r---\rkind: ClusterRoleBinding\u{2028}a: b\u{85}c\nsecond");
        assert_eq!(c, "# x --- kind: ClusterRoleBinding a: b c\n# second\n");
        let parsed = toolgate_config::parse_yaml_value(&format!("{c}k: v\n")).unwrap();
        assert_eq!(parsed, json!({"k": "v"}));
    }

    #[test]
    fn a_broken_spec_says_which_syntax_failed_once() {
        let yaml = parse("openapi: 3.0.0\npaths: [unclosed\n").unwrap_err();
        assert_eq!(yaml.matches("not valid YAML").count(), 1, "{yaml}");
        let json = parse("{\"openapi\": ").unwrap_err();
        assert!(json.starts_with("not valid JSON: "), "{json}");
    }

    #[test]
    fn resource_names_are_dns_labels() {
        assert_eq!(resource_name("shop", "get_Customer.v2"), "shop-get-customer-v2");
        assert_eq!(resource_name("a", "__x__"), "a-x");
        assert!(resource_name("s", &"y".repeat(400)).len() <= 253);
    }
}
