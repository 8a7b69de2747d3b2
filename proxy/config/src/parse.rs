//! Reading a `ProxyConfig` from YAML or JSON text, with every problem reported by path.

use std::fmt;

use serde_json::Value;

use crate::ProxyConfig;

/// One problem in a config document: where (a dotted path, naming the tool when known) and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Path of the offending key, e.g. `tools[1] (create_ticket).http.path`.
    pub path: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl ConfigError {
    /// A problem at `path`.
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// A config that could not be loaded: every problem found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct LoadError {
    /// The problems, in document order.
    pub errors: Vec<ConfigError>,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.errors.len();
        write!(f, "{n} problem{}", if n == 1 { "" } else { "s" })?;
        for e in &self.errors {
            write!(f, "\n  - {e}")?;
        }
        Ok(())
    }
}

impl From<Vec<ConfigError>> for LoadError {
    fn from(errors: Vec<ConfigError>) -> Self {
        Self { errors }
    }
}

/// Parses YAML (a superset of JSON) and validates the result.
pub fn parse_yaml(text: &str) -> Result<ProxyConfig, LoadError> {
    let value = parse_yaml_value(text)?;
    from_value(value)
}

/// Parses a config file's text: JSON when it is a JSON object (large generated configs, such as
/// a whole OpenAPI import, read without YAML's node budget), YAML otherwise; then validates it.
pub fn parse_text(text: &str) -> Result<ProxyConfig, LoadError> {
    let config = parse_text_unvalidated(text)?;
    config.validate()?;
    Ok(config)
}

/// [`parse_text`] without the validation, for a caller that validates anyway: the proxy's
/// `Runtime::compile` runs [`ProxyConfig::validate`] itself, so validating here too would
/// compile every schema twice per load.
pub fn parse_text_unvalidated(text: &str) -> Result<ProxyConfig, LoadError> {
    let value = if text.trim_start().starts_with('{') {
        parse_json_value(text)?
    } else {
        parse_yaml_value(text)?
    };
    deserialize(value)
}

/// Parses JSON and validates the result.
pub fn parse_json(text: &str) -> Result<ProxyConfig, LoadError> {
    from_value(parse_json_value(text)?)
}

fn parse_json_value(text: &str) -> Result<Value, LoadError> {
    serde_json::from_str(text).map_err(|e| LoadError::from(vec![ConfigError::new("", format!("not valid JSON: {e}"))]))
}

/// Parses YAML into a JSON value: mapping keys become strings (`404:` and `"404":` are the same),
/// non-finite numbers and duplicate keys are refused, `yes`, `on`, `0755` and `1_000` stay
/// strings; see [`crate::yaml`] for the rules and the limits.
pub fn parse_yaml_value(text: &str) -> Result<Value, LoadError> {
    crate::yaml::to_value(text).map_err(|e| LoadError::from(vec![ConfigError::new("", format!("not valid YAML: {e}"))]))
}

/// Deserializes and validates a JSON value.
pub fn from_value(value: Value) -> Result<ProxyConfig, LoadError> {
    let config = deserialize(value)?;
    config.validate()?;
    Ok(config)
}

/// Deserializes a JSON value; a type error names its key, and the tool by name.
fn deserialize(value: Value) -> Result<ProxyConfig, LoadError> {
    match serde_path_to_error::deserialize(&value) {
        Ok(c) => Ok(c),
        Err(e) => {
            let path = name_tools_in_path(&e.path().to_string(), &value);
            let path = if path == "." { String::new() } else { path };
            Err(vec![ConfigError::new(path, e.into_inner().to_string())].into())
        }
    }
}

/// `tools[2].http` → `tools[2] (create_ticket).http` when the document names that tool.
fn name_tools_in_path(path: &str, doc: &Value) -> String {
    let Some(rest) = path.strip_prefix("tools[") else {
        return path.to_string();
    };
    let Some(end) = rest.find(']') else {
        return path.to_string();
    };
    let Ok(index) = rest[..end].parse::<usize>() else {
        return path.to_string();
    };
    match doc.pointer(&format!("/tools/{index}/name")).and_then(Value::as_str) {
        Some(name) => format!("tools[{index}] ({name}){}", &rest[end + 1..]),
        None => path.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str =
        "apiVersion: toolgate.dev/v1alpha1\nkind: ProxyConfig\nupstream: {baseUrl: 'http://127.0.0.1:1'}\n";

    #[test]
    fn an_unvalidated_parse_defers_every_check_to_validation_and_loses_none() {
        // Valid by type, invalid by rule: a duplicate name and a schema that is not an object.
        let text = format!(
            "{HEAD}tools:\n  - {{name: a, inputSchema: {{type: object}}, http: {{method: GET, path: /a}}}}\n  \
             - {{name: a, inputSchema: {{type: array}}, http: {{method: GET, path: /b}}}}\n"
        );
        let refused = parse_text(&text).unwrap_err().to_string();
        let parsed = parse_text_unvalidated(&text).expect("types are right, so it parses");
        let deferred = LoadError::from(parsed.validate().unwrap_err()).to_string();
        assert_eq!(deferred, refused, "validation finds exactly what parse_text reported");
        assert!(refused.contains("tools[1] (a).name: duplicate tool name"), "{refused}");

        // The same document as JSON parses to the same config.
        let value = parse_yaml_value(&text).unwrap();
        let json = parse_text_unvalidated(&value.to_string()).unwrap();
        assert_eq!(json, parsed);
    }

    #[test]
    fn an_unvalidated_parse_still_refuses_syntax_and_types_with_the_key() {
        let e = parse_text_unvalidated("{\"apiVersion\": ").unwrap_err().to_string();
        assert!(e.contains("not valid JSON"), "{e}");
        let e = parse_text_unvalidated("a: [").unwrap_err().to_string();
        assert!(e.contains("not valid YAML"), "{e}");
        let text = format!(
            "{HEAD}tools:\n  - {{name: find, inputSchema: {{type: object}}, http: {{method: GET, path: /a, timeoutMs: soon}}}}\n"
        );
        let e = parse_text_unvalidated(&text).unwrap_err().to_string();
        assert!(
            e.contains("tools[0] (find).http"),
            "the key and the tool are named: {e}"
        );
    }
}
