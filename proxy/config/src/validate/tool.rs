//! Checks of one tool: name, mapping, pointers, status classes and its schemas.

use std::collections::BTreeSet;

use serde_json::Value;

use super::{check_timeout, is_token_byte, RESERVED_HEADERS};
use crate::pointer::Pointer;
use crate::{BodyMapping, ConfigError, Template, ToolConfig};

/// Whether `name` is a valid MCP tool name: 1-128 of `A-Z a-z 0-9 _ - .`.
pub fn is_valid_tool_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// Checks `tool`, its schemas with `schemas`.
pub(super) fn validate_tool(
    tool: &ToolConfig,
    at: &str,
    schemas: &mut crate::schema::Checker,
    errs: &mut Vec<ConfigError>,
) {
    if !is_valid_tool_name(&tool.name) {
        errs.push(ConfigError::new(
            format!("{at}.name"),
            "must be 1-128 characters of letters, digits, `_`, `-` or `.`",
        ));
    }
    let declared = check_schema(&tool.input_schema, &format!("{at}.inputSchema"), schemas, errs);
    if let Some(out) = &tool.output_schema {
        check_schema(out, &format!("{at}.outputSchema"), schemas, errs);
    }
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
}

fn is_status_key(key: &str) -> bool {
    let b = key.as_bytes();
    if b.len() != 3 || !(b'1'..=b'5').contains(&b[0]) {
        return false;
    }
    (b[1].is_ascii_digit() && b[2].is_ascii_digit()) || (b[1] == b'x' && b[2] == b'x')
}

/// Checks that `schema` is an object schema that compiles; returns its declared property names.
fn check_schema(
    schema: &Value,
    at: &str,
    schemas: &mut crate::schema::Checker,
    errs: &mut Vec<ConfigError>,
) -> Option<BTreeSet<String>> {
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
    if let Err(e) = schemas.check(schema) {
        errs.push(ConfigError::new(at, format!("is not a valid JSON Schema: {e}")));
        return None;
    }
    let declared = obj
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default();
    Some(declared)
}
