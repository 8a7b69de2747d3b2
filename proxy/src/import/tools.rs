//! OpenAPI operations → tools: one tool per operation, or the reason it was skipped.

use std::collections::{BTreeMap, HashSet};

use serde_json::{json, Map, Value};
use toolgate_config::{
    Annotations, BodyMapping, BodyMode, HttpMapping, Method, ResponseShaping, SemanticContract, ToolConfig,
};

use super::schema::{self, MAX_SCHEMA_BYTES};
use super::spec::{Body, Location, Operation, Param, Spec};

/// Whether a media type carries JSON (`application/json`, `application/problem+json`, ...).
pub fn is_json(media_type: &str) -> bool {
    let t = media_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    t == "application/json" || (t.starts_with("application/") && t.ends_with("+json")) || t == "*/*"
}

/// What the import makes of one operation.
#[derive(Debug)]
pub enum Outcome {
    /// A tool, with notes on what was left out of it.
    Tool(Box<ToolConfig>, Vec<String>),
    /// Skipped, and why.
    Skipped(String),
}

/// One operation's result, named for the comment above it.
#[derive(Debug)]
pub struct Imported {
    /// `METHOD /path`.
    pub route: String,
    /// `operationId`, if any.
    pub operation_id: Option<String>,
    /// The tool or the reason.
    pub outcome: Outcome,
}

/// What to import.
#[derive(Debug, Default, Clone)]
pub struct Filter {
    /// Globs; an operation is imported when it matches one (all when empty).
    pub include: Vec<String>,
    /// Globs; an operation matching one is left out.
    pub exclude: Vec<String>,
}

impl Filter {
    /// A glob matches by `operationId`, tag (`tag:NAME`), path (`path:/GLOB` or any glob starting
    /// with `/`) or, without a prefix, by operationId or tag.
    fn matches(glob: &str, op: &Operation) -> bool {
        let g = crate::policy::glob;
        if let Some(t) = glob.strip_prefix("tag:") {
            return op.tags.iter().any(|tag| g(t, tag));
        }
        if let Some(p) = glob.strip_prefix("path:") {
            return g(p, &op.path);
        }
        if glob.starts_with('/') {
            return g(glob, &op.path);
        }
        op.operation_id.as_deref().is_some_and(|id| g(glob, id)) || op.tags.iter().any(|tag| g(glob, tag))
    }

    fn admits(&self, op: &Operation) -> bool {
        (self.include.is_empty() || self.include.iter().any(|i| Self::matches(i, op)))
            && !self.exclude.iter().any(|e| Self::matches(e, op))
    }
}

/// The MCP name for `raw`: 1-128 of `A-Z a-z 0-9 _ - .`, other characters as `_`.
fn tool_name(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    for c in raw.chars() {
        let c = if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') {
            c
        } else {
            '_'
        };
        if !(c == '_' && out.ends_with('_')) {
            out.push(c);
        }
    }
    let out = out.trim_matches('_').to_string();
    let out = if out.is_empty() { "operation".to_string() } else { out };
    out.chars().take(120).collect()
}

/// An argument name usable in a template placeholder.
fn argument_name(raw: &str) -> String {
    let mut out: String = raw
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' })
        .collect();
    if out.is_empty() || out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

/// Headers a tool never takes from arguments: OpenAPI says `Accept`, `Content-Type` and
/// `Authorization` parameters are ignored; credentials belong to the proxy's upstream
/// credential, not to the agent; and the proxy sets the trace context, the request id and the
/// provenance headers itself (over any tool header).
fn reserved_header(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    matches!(
        n.as_str(),
        "authorization"
            | "content-type"
            | "accept"
            | "cookie"
            | "host"
            | "content-length"
            | "proxy-authorization"
            | "traceparent"
            | "tracestate"
            | "x-request-id"
    ) || n.starts_with("x-toolgate-")
}

fn method(m: &str) -> Option<Method> {
    Some(match m {
        "get" => Method::Get,
        "post" => Method::Post,
        "put" => Method::Put,
        "patch" => Method::Patch,
        "delete" => Method::Delete,
        "head" => Method::Head,
        _ => return None,
    })
}

fn annotations(m: Method) -> Annotations {
    let read = matches!(m, Method::Get | Method::Head);
    Annotations {
        read_only_hint: Some(read),
        destructive_hint: Some(m == Method::Delete),
        idempotent_hint: Some(!matches!(m, Method::Post | Method::Patch)),
        open_world_hint: Some(false),
    }
}

fn with_description(mut schema: Value, description: Option<&str>) -> Value {
    if let (Some(d), Value::Object(m)) = (description, &mut schema) {
        if !m.contains_key("description") && !d.trim().is_empty() {
            m.insert("description".into(), json!(d.trim()));
        }
    }
    schema
}

/// The body schema's properties, when they can become arguments beside the parameters: an
/// object with `properties` and nothing at its root that relates them (combinators, pattern
/// properties), none named like an argument already taken.
fn flattenable<'a>(body: &'a Value, taken: &HashSet<String>) -> Option<&'a Map<String, Value>> {
    let m = body.as_object()?;
    let is_object = m
        .get("type")
        .is_some_and(|t| t == "object" || t.as_array().is_some_and(|a| a == &[json!("object")]));
    let combined = [
        "allOf",
        "anyOf",
        "oneOf",
        "not",
        "if",
        "patternProperties",
        "dependentSchemas",
        "$ref",
        "unevaluatedProperties",
    ]
    .iter()
    .any(|k| m.contains_key(*k));
    let props = m.get("properties")?.as_object()?;
    let extra_schema = m.get("additionalProperties").is_some_and(Value::is_object);
    let clash = props.keys().any(|k| taken.contains(k) || argument_name(k) != *k);
    (is_object && !combined && !extra_schema && !props.is_empty() && !clash).then_some(props)
}

fn route(op: &Operation) -> String {
    format!("{} {}", op.method.to_ascii_uppercase(), op.path)
}

/// Builds one tool, or says why not.
fn build(op: &Operation, spec: &Spec, output_schemas: bool) -> Result<(ToolConfig, Vec<String>), String> {
    if let Some(p) = &op.problem {
        return Err(p.clone());
    }
    let m = method(&op.method)
        .ok_or_else(|| format!("the method {} has no tool mapping", op.method.to_ascii_uppercase()))?;
    let mut notes = Vec::new();
    let mut properties = Map::new();
    let mut required: Vec<String> = Vec::new();
    let mut taken = HashSet::new();
    // Some specs (AWS's) make path keys unique with a fragment (`/Put#channelArn`) or carry a
    // fixed query (`/?Action=List`): the fragment is never sent, the query is literal.
    let (path_part, _fragment) = op.path.split_once('#').unwrap_or((&op.path, ""));
    let (path_part, fixed_query) = path_part.split_once('?').unwrap_or((path_part, ""));
    let mut path = path_part.to_string();
    let mut query = BTreeMap::new();
    for pair in fixed_query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k.contains(['{', '}']) || v.contains(['{', '}']) {
            return Err(format!("the path's query `{fixed_query}` holds a placeholder"));
        }
        query.insert(k.to_string(), v.to_string());
    }
    let mut headers = BTreeMap::new();
    let add = |p: &Param, arg: String, properties: &mut Map<String, Value>, required: &mut Vec<String>| {
        let schema = p
            .schema
            .as_ref()
            .map_or(json!({}), |s| schema::normalize(s, spec.version));
        properties.insert(arg.clone(), with_description(schema, p.description.as_deref()));
        if p.required {
            required.push(arg);
        }
    };
    for p in &op.params {
        if p.schema.is_none() {
            if p.required {
                return Err(format!(
                    "the {:?} parameter `{}` is given as `content`, not a schema",
                    p.location, p.name
                )
                .to_lowercase());
            }
            notes.push(format!(
                "optional parameter `{}` left out: it is given as `content`, not a schema",
                p.name
            ));
            continue;
        }
        if let Some(style) = &p.unusual_style {
            if p.required {
                return Err(format!(
                    "the parameter `{}` uses {style}, which the proxy does not build",
                    p.name
                ));
            }
            notes.push(format!("optional parameter `{}` left out: it uses {style}", p.name));
            continue;
        }
        match p.location {
            Location::Cookie => {
                if p.required {
                    return Err(format!(
                        "it needs the cookie `{}`; the proxy sends no client-chosen cookies",
                        p.name
                    ));
                }
                notes.push(format!("optional cookie `{}` left out", p.name));
                continue;
            }
            Location::Header if reserved_header(&p.name) => {
                notes.push(format!("header parameter `{}` left out: the proxy sets it", p.name));
                continue;
            }
            _ => {}
        }
        let arg = argument_name(&p.name);
        if !taken.insert(arg.clone()) {
            return Err(format!(
                "parameter name collision: two parameters become the argument `{arg}`"
            ));
        }
        match p.location {
            Location::Path => {
                let placeholder = format!("{{{}}}", p.name);
                if !path.contains(&placeholder) {
                    return Err(format!("the path parameter `{}` does not appear in the path", p.name));
                }
                path = path.replace(&placeholder, &format!("{{{arg}}}"));
            }
            Location::Query => {
                query.insert(p.name.clone(), format!("{{{arg}}}"));
            }
            Location::Header => {
                headers.insert(p.name.clone(), format!("{{{arg}}}"));
            }
            Location::Cookie => unreachable!("cookies were handled above"),
        }
        add(p, arg, &mut properties, &mut required);
    }
    if path.contains('{')
        && path
            .split('{')
            .skip(1)
            .any(|s| !s.split('}').next().is_some_and(|v| taken.contains(v)))
    {
        return Err("the path has a placeholder no parameter declares".into());
    }
    let mut body_mapping = if m.has_body_by_default() {
        Some(BodyMapping::Mode(BodyMode::None))
    } else {
        None
    };
    let mut body_schema_root: Option<Value> = None;
    if let Some(Body {
        required: body_required,
        description,
        content,
    }) = &op.body
    {
        if m.is_read() && !content.is_empty() {
            if *body_required {
                return Err(format!(
                    "a {} request with a body: the proxy sends GET and HEAD without one",
                    m.as_str()
                ));
            }
            notes.push(format!(
                "optional request body left out: {} requests carry none",
                m.as_str()
            ));
            return finish(
                op,
                m,
                spec,
                properties,
                required,
                path,
                query,
                headers,
                None,
                None,
                notes,
                output_schemas,
            );
        }
        let json_body = content.iter().find(|(t, _)| is_json(t));
        let Some((_, schema)) = json_body else {
            let types: Vec<&str> = content.iter().map(|(t, _)| t.as_str()).collect();
            if !*body_required {
                notes.push(format!(
                    "optional request body left out: it is {}, not JSON",
                    types.join(", ")
                ));
            } else {
                return Err(format!("the request body is {}, not JSON", types.join(", ")));
            }
            return finish(
                op,
                m,
                spec,
                properties,
                required,
                path,
                query,
                headers,
                body_mapping,
                None,
                notes,
                output_schemas,
            );
        };
        let body = schema
            .as_ref()
            .map_or(json!({}), |s| schema::normalize(s, spec.version));
        // A body given by `$ref` is looked at through the reference to decide on flattening.
        let mut looked = body.clone();
        if looked.get("$ref").is_some() {
            schema::resolve(&mut [&mut looked], &spec.schemas, spec.version).map_err(|e| e.0)?;
        }
        if let Some(props) = flattenable(&looked, &taken) {
            let body_required_list: Vec<String> = looked
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
                .unwrap_or_default();
            for (k, v) in props {
                properties.insert(k.clone(), v.clone());
            }
            if *body_required {
                required.extend(body_required_list);
            } else if !body_required_list.is_empty() {
                notes.push("the body is optional, so its required properties are not required arguments".into());
            }
            let names: Vec<String> = props.keys().cloned().collect();
            body_mapping = Some(if looked.get("additionalProperties") == Some(&Value::Bool(false)) {
                BodyMapping::Fields(names)
            } else {
                BodyMapping::Mode(BodyMode::All)
            });
            body_schema_root = Some(looked);
        } else {
            let name = ["body", "requestBody", "payload"]
                .into_iter()
                .find(|n| !taken.contains(*n))
                .ok_or("parameter name collision: `body`, `requestBody` and `payload` are all parameters")?;
            properties.insert(name.to_string(), with_description(body, description.as_deref()));
            if *body_required {
                required.push(name.to_string());
            }
            body_mapping = Some(BodyMapping::Argument(toolgate_config::ArgumentBody {
                argument: name.to_string(),
            }));
        }
    }
    finish(
        op,
        m,
        spec,
        properties,
        required,
        path,
        query,
        headers,
        body_mapping,
        body_schema_root,
        notes,
        output_schemas,
    )
}

#[allow(clippy::too_many_arguments)]
fn finish(
    op: &Operation,
    m: Method,
    spec: &Spec,
    properties: Map<String, Value>,
    mut required: Vec<String>,
    path: String,
    query: BTreeMap<String, String>,
    headers: BTreeMap<String, String>,
    body: Option<BodyMapping>,
    flattened_body: Option<Value>,
    mut notes: Vec<String>,
    output_schemas: bool,
) -> Result<(ToolConfig, Vec<String>), String> {
    let mut seen = HashSet::new();
    required.retain(|r| seen.insert(r.clone()));
    let closed = flattened_body
        .as_ref()
        .is_none_or(|b| b.get("additionalProperties") == Some(&Value::Bool(false)));
    let mut input = json!({"type": "object", "properties": properties});
    if !required.is_empty() {
        input["required"] = json!(required);
    }
    if closed {
        input["additionalProperties"] = json!(false);
    }
    let mut output = if output_schemas {
        op.response_schema.as_ref().map(|s| schema::normalize(s, spec.version))
    } else {
        None
    };
    let mut schemas: Vec<&mut Value> = vec![&mut input];
    if let Some(o) = output.as_mut() {
        schemas.push(o);
    }
    let defs = schema::resolve(&mut schemas, &spec.schemas, spec.version).map_err(|e| e.0)?;
    // The proxy wraps an answer that is not an object, so only an object schema describes
    // `data`; through a `$ref` the referenced definition decides. (A 3.1 `true` schema says
    // nothing and is left out too.)
    if let Some(o) = &output {
        let target = match o
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| r.strip_prefix("#/$defs/"))
        {
            Some(name) => defs
                .as_ref()
                .and_then(|d| d.get(&name.replace("~1", "/").replace("~0", "~"))),
            None => Some(o),
        };
        if !target.is_some_and(|t| t.get("type").is_some_and(|t| t == "object")) {
            notes.push("outputSchema left out: the response is not declared as an object".into());
            output = None;
        }
    }
    if let Some(defs) = defs {
        input["$defs"] = Value::Object(defs.clone());
        if let Some(Value::Object(o)) = output.as_mut() {
            o.insert("$defs".into(), Value::Object(defs));
        }
    }
    for (what, s) in [("inputSchema", Some(&input)), ("outputSchema", output.as_ref())] {
        if let Some(s) = s {
            let size = s.to_string().len();
            if size > MAX_SCHEMA_BYTES {
                return Err(format!(
                    "its {what} is {} KiB, over the {} KiB a tool may carry",
                    size / 1024,
                    MAX_SCHEMA_BYTES / 1024
                ));
            }
        }
    }
    let summary = op.summary.as_deref().map(str::trim).filter(|s| !s.is_empty());
    let mut description = op
        .description
        .as_deref()
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .or(summary)
        .map_or_else(|| route(op), str::to_string);
    if op.deprecated {
        description = format!("Deprecated. {description}");
    }
    let tool = ToolConfig {
        name: String::new(),
        title: summary.map(|s| s.chars().take(200).collect()),
        description,
        contract: SemanticContract::default(),
        input_schema: input,
        output_schema: output,
        annotations: Some(annotations(m)),
        tier: None,
        required_role: None,
        safety: None,
        http: HttpMapping {
            method: m,
            path,
            query,
            headers,
            body: body.filter(|b| !(m.has_body_by_default() && *b == BodyMapping::Mode(BodyMode::All))),
            timeout_ms: None,
        },
        response: ResponseShaping::default(),
    };
    Ok((tool, notes))
}

/// Every operation of `spec` that `filter` admits, in document order, with unique names.
pub fn import(spec: &Spec, filter: &Filter, output_schemas: bool) -> Vec<Imported> {
    let mut names = HashSet::new();
    let mut out = Vec::new();
    for op in spec.operations.iter().filter(|op| filter.admits(op)) {
        let base = tool_name(
            op.operation_id
                .as_deref()
                .unwrap_or(&format!("{}_{}", op.method, op.path)),
        );
        let outcome = match build(op, spec, output_schemas) {
            Ok((mut tool, notes)) => {
                let mut name = base.clone();
                let mut n = 2;
                while !names.insert(name.to_ascii_lowercase()) {
                    name = format!("{base}_{n}");
                    n += 1;
                }
                tool.name = name;
                Outcome::Tool(Box::new(tool), notes)
            }
            Err(reason) => Outcome::Skipped(reason),
        };
        out.push(Imported {
            route: route(op),
            operation_id: op.operation_id.clone(),
            outcome,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_valid_mcp_names() {
        assert_eq!(tool_name("repos/get-content"), "repos_get-content");
        assert_eq!(tool_name("get /pets/{petId}"), "get_pets_petId");
        assert_eq!(tool_name("***"), "operation");
        let long = tool_name(&"é".repeat(300));
        assert!(
            !long.is_empty()
                && long.len() <= 128
                && long.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
        );
        assert_eq!(argument_name("filter[name]"), "filter_name_");
        assert_eq!(argument_name("X-Request-Id"), "X_Request_Id");
        assert_eq!(argument_name("2fa"), "_2fa");
    }

    #[test]
    fn json_media_types() {
        assert!(is_json("application/json; charset=utf-8"));
        assert!(is_json("application/vnd.github+json"));
        assert!(!is_json("multipart/form-data"));
        assert!(!is_json("text/plain"));
    }
}
