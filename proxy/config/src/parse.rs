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

/// Parses JSON and validates the result.
pub fn parse_json(text: &str) -> Result<ProxyConfig, LoadError> {
    let value: Value = serde_json::from_str(text)
        .map_err(|e| LoadError::from(vec![ConfigError::new("", format!("not valid JSON: {e}"))]))?;
    from_value(value)
}

/// Parses YAML into a JSON value: mapping keys become strings (`404:` and `"404":` are the same).
pub fn parse_yaml_value(text: &str) -> Result<Value, LoadError> {
    let yaml: serde_yaml::Value = serde_yaml::from_str(text)
        .map_err(|e| LoadError::from(vec![ConfigError::new("", format!("not valid YAML: {e}"))]))?;
    yaml_to_json(yaml, "").map_err(|e| LoadError::from(vec![e]))
}

fn yaml_to_json(v: serde_yaml::Value, path: &str) -> Result<Value, ConfigError> {
    use serde_yaml::Value as Y;
    Ok(match v {
        Y::Null => Value::Null,
        Y::Bool(b) => Value::Bool(b),
        Y::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                let f = n.as_f64().unwrap_or(f64::NAN);
                serde_json::Number::from_f64(f)
                    .map(Value::Number)
                    .ok_or_else(|| ConfigError::new(path, "numbers must be finite"))?
            }
        }
        Y::String(s) => Value::String(s),
        Y::Sequence(items) => Value::Array(
            items
                .into_iter()
                .enumerate()
                .map(|(i, item)| yaml_to_json(item, &format!("{path}[{i}]")))
                .collect::<Result<_, _>>()?,
        ),
        Y::Mapping(map) => {
            let mut out = serde_json::Map::with_capacity(map.len());
            for (k, v) in map {
                let key = match k {
                    Y::String(s) => s,
                    Y::Number(n) => n.to_string(),
                    Y::Bool(b) => b.to_string(),
                    other => {
                        return Err(ConfigError::new(
                            path,
                            format!("mapping keys must be strings, found {other:?}"),
                        ))
                    }
                };
                let child = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                out.insert(key, yaml_to_json(v, &child)?);
            }
            Value::Object(out)
        }
        Y::Tagged(t) => yaml_to_json(t.value, path)?,
    })
}

/// Deserializes and validates a JSON value.
pub fn from_value(value: Value) -> Result<ProxyConfig, LoadError> {
    let config: ProxyConfig = match serde_path_to_error::deserialize(&value) {
        Ok(c) => c,
        Err(e) => {
            let path = name_tools_in_path(&e.path().to_string(), &value);
            let path = if path == "." { String::new() } else { path };
            return Err(vec![ConfigError::new(path, e.into_inner().to_string())].into());
        }
    };
    config.validate()?;
    Ok(config)
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
