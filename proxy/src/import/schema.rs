//! OpenAPI schemas → the JSON Schema (2020-12) of a tool: 3.0's `nullable` and boolean
//! `exclusiveMinimum`/`exclusiveMaximum` rewritten, OpenAPI-only keywords (`discriminator`,
//! `xml`, `externalDocs`, `example`, `x-*`) dropped, and `#/components/schemas/…` references
//! inlined when the result stays small and acyclic, otherwise carried in `$defs` (a recursive
//! type stays recursive; such a tool validates on the proxy's blocking pool).

use std::collections::BTreeSet;

use serde_json::{json, Map, Value};

use super::spec::Version;

/// Largest inlined schema (serialized); past it references stay in `$defs`.
const MAX_INLINED_BYTES: usize = 64 * 1024;

/// Largest schema of one tool (serialized), `$defs` included: a tool must fit, many times over,
/// in the operator's ConfigMap.
pub const MAX_SCHEMA_BYTES: usize = 256 * 1024;

const REF_PREFIX: &str = "#/components/schemas/";

/// Keywords whose value is a schema.
const SCHEMA_VALUED: &[&str] = &[
    "items",
    "additionalProperties",
    "not",
    "contains",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
    "if",
    "then",
    "else",
    "additionalItems",
];
/// Keywords whose value is a list of schemas.
const SCHEMA_LISTS: &[&str] = &["allOf", "anyOf", "oneOf", "prefixItems"];
/// Keywords whose value maps names to schemas.
const SCHEMA_MAPS: &[&str] = &[
    "properties",
    "patternProperties",
    "dependentSchemas",
    "$defs",
    "definitions",
];

/// `schema` in the tool dialect, without resolving references.
pub fn normalize(schema: &Value, version: Version) -> Value {
    let Value::Object(m) = schema else {
        return schema.clone();
    };
    let mut out = Map::new();
    for (k, v) in m {
        if k.starts_with("x-") || matches!(k.as_str(), "discriminator" | "xml" | "externalDocs" | "example") {
            continue;
        }
        if version == Version::V30
            && matches!(k.as_str(), "nullable" | "exclusiveMinimum" | "exclusiveMaximum")
            && v.is_boolean()
        {
            continue;
        }
        let v = if SCHEMA_VALUED.contains(&k.as_str()) {
            normalize(v, version)
        } else if SCHEMA_LISTS.contains(&k.as_str()) {
            match v {
                Value::Array(a) => Value::Array(a.iter().map(|s| normalize(s, version)).collect()),
                other => other.clone(),
            }
        } else if SCHEMA_MAPS.contains(&k.as_str()) {
            match v {
                Value::Object(props) => {
                    Value::Object(props.iter().map(|(n, s)| (n.clone(), normalize(s, version))).collect())
                }
                other => other.clone(),
            }
        } else {
            v.clone()
        };
        out.insert(k.clone(), v);
    }
    if version == Version::V30 {
        for (flag, bound) in [("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")] {
            if m.get(flag) == Some(&Value::Bool(true)) {
                if let Some(b) = out.remove(bound) {
                    out.insert(flag.into(), b);
                }
            }
        }
        if m.get("nullable") == Some(&Value::Bool(true)) {
            match out.get("type").cloned() {
                Some(Value::String(t)) => {
                    out.insert("type".into(), json!([t, "null"]));
                }
                Some(Value::Array(mut ts)) if !ts.contains(&json!("null")) => {
                    ts.push(json!("null"));
                    out.insert("type".into(), Value::Array(ts));
                }
                _ => {}
            }
            if let Some(Value::Array(e)) = out.get_mut("enum") {
                if !e.contains(&Value::Null) {
                    e.push(Value::Null);
                }
            }
        }
    }
    Value::Object(out)
}

/// Why a schema could not be made self-contained.
#[derive(Debug)]
pub struct RefError(pub String);

fn referenced(schema: &Value, out: &mut Vec<String>) -> Result<(), RefError> {
    match schema {
        Value::Object(m) => {
            if let Some(r) = m.get("$ref").and_then(Value::as_str) {
                match r.strip_prefix(REF_PREFIX) {
                    Some(name) => out.push(unescape(name)),
                    None if r.starts_with("#/$defs/") => {}
                    None => {
                        return Err(RefError(format!(
                            "`$ref: {r}` is not a local components.schemas reference"
                        )))
                    }
                }
            }
            m.values().try_for_each(|v| referenced(v, out))
        }
        Value::Array(a) => a.iter().try_for_each(|v| referenced(v, out)),
        _ => Ok(()),
    }
}

fn unescape(token: &str) -> String {
    let decoded = percent_encoding::percent_decode_str(token).decode_utf8_lossy();
    decoded.replace("~1", "/").replace("~0", "~")
}

fn def_ref(name: &str) -> String {
    format!("#/$defs/{}", name.replace('~', "~0").replace('/', "~1"))
}

/// Inlines every reference of `schema`; `None` on a cycle or past [`MAX_INLINED_BYTES`].
fn inline(schema: &Value, defs: &Map<String, Value>, stack: &mut Vec<String>, budget: &mut usize) -> Option<Value> {
    match schema {
        Value::Object(m) => {
            if let Some(name) = m
                .get("$ref")
                .and_then(Value::as_str)
                .and_then(|r| r.strip_prefix(REF_PREFIX))
            {
                let name = unescape(name);
                if stack.contains(&name) {
                    return None;
                }
                let target = defs.get(&name)?;
                *budget = budget.checked_sub(target.to_string().len())?;
                stack.push(name);
                let mut resolved = inline(target, defs, stack, budget)?;
                stack.pop();
                // Siblings of `$ref` (3.1 allows `description` beside it) are kept.
                if let Value::Object(r) = &mut resolved {
                    for (k, v) in m.iter().filter(|(k, _)| *k != "$ref") {
                        r.insert(k.clone(), inline(v, defs, stack, budget)?);
                    }
                }
                return Some(resolved);
            }
            let mut out = Map::new();
            for (k, v) in m {
                out.insert(k.clone(), inline(v, defs, stack, budget)?);
            }
            Some(Value::Object(out))
        }
        Value::Array(a) => a
            .iter()
            .map(|v| inline(v, defs, stack, budget))
            .collect::<Option<Vec<_>>>()
            .map(Value::Array),
        other => Some(other.clone()),
    }
}

fn rewrite_refs(schema: &mut Value) {
    match schema {
        Value::Object(m) => {
            if let Some(Value::String(r)) = m.get_mut("$ref") {
                if let Some(name) = r.strip_prefix(REF_PREFIX) {
                    *r = def_ref(&unescape(name));
                }
            }
            m.values_mut().for_each(rewrite_refs);
        }
        Value::Array(a) => a.iter_mut().for_each(rewrite_refs),
        _ => {}
    }
}

/// The component schemas (normalized) that `roots` reach, transitively.
fn closure(
    roots: &[&Value],
    components: &Map<String, Value>,
    version: Version,
) -> Result<Map<String, Value>, RefError> {
    let mut todo = Vec::new();
    for r in roots {
        referenced(r, &mut todo)?;
    }
    let mut seen = BTreeSet::new();
    let mut out = Map::new();
    while let Some(name) = todo.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        let Some(s) = components.get(&name) else {
            return Err(RefError(format!(
                "`$ref: {REF_PREFIX}{name}` names no schema in components.schemas"
            )));
        };
        let s = normalize(s, version);
        referenced(&s, &mut todo)?;
        out.insert(name, s);
    }
    // Deterministic order: by name.
    let mut sorted: Vec<(String, Value)> = out.into_iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(sorted.into_iter().collect())
}

/// Makes `schemas` (already normalized, sharing one tool) self-contained: references inlined
/// when they can be, else kept as `$defs` (returned, to be put on the tool's root schema).
pub fn resolve(
    schemas: &mut [&mut Value],
    components: &Map<String, Value>,
    version: Version,
) -> Result<Option<Map<String, Value>>, RefError> {
    let defs = closure(&schemas.iter().map(|s| &**s).collect::<Vec<_>>(), components, version)?;
    if defs.is_empty() {
        return Ok(None);
    }
    let mut budget = MAX_INLINED_BYTES;
    let inlined: Option<Vec<Value>> = schemas
        .iter()
        .map(|s| inline(s, &defs, &mut Vec::new(), &mut budget))
        .collect();
    if let Some(inlined) = inlined {
        for (s, i) in schemas.iter_mut().zip(inlined) {
            **s = i;
        }
        return Ok(None);
    }
    for s in schemas.iter_mut() {
        rewrite_refs(s);
    }
    let mut defs = defs;
    defs.values_mut().for_each(rewrite_refs);
    Ok(Some(defs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openapi_30_keywords_become_json_schema() {
        let s = json!({"type": "integer", "minimum": 1, "exclusiveMinimum": true, "nullable": true,
            "maximum": 9, "exclusiveMaximum": false, "example": 3, "x-go-type": "int", "xml": {"name": "n"}});
        assert_eq!(
            normalize(&s, Version::V30),
            json!({"type": ["integer", "null"], "exclusiveMinimum": 1, "maximum": 9})
        );
        let e = json!({"properties": {"p": {"type": "string", "enum": ["a"], "nullable": true}}});
        assert_eq!(
            normalize(&e, Version::V30),
            json!({"properties": {"p": {"type": ["string", "null"], "enum": ["a", null]}}})
        );
        // 3.1's numeric exclusive bounds stay as they are.
        let n = json!({"type": "number", "exclusiveMinimum": 0});
        assert_eq!(normalize(&n, Version::V31), n);
    }

    #[test]
    fn references_are_inlined_unless_they_recurse() {
        let components = json!({
            "Pet": {"type": "object", "properties": {"tag": {"$ref": "#/components/schemas/Tag"}}},
            "Tag": {"type": "string", "nullable": true},
            "Node": {"type": "object", "properties": {"next": {"$ref": "#/components/schemas/Node"}}},
        });
        let components = components.as_object().unwrap();
        let mut s = json!({"$ref": "#/components/schemas/Pet"});
        assert!(resolve(&mut [&mut s], components, Version::V30).unwrap().is_none());
        assert_eq!(
            s,
            json!({"type": "object", "properties": {"tag": {"type": ["string", "null"]}}})
        );

        let mut r = json!({"type": "object", "properties": {"head": {"$ref": "#/components/schemas/Node"}}});
        let defs = resolve(&mut [&mut r], components, Version::V30).unwrap().unwrap();
        assert_eq!(r["properties"]["head"]["$ref"], "#/$defs/Node");
        assert_eq!(defs["Node"]["properties"]["next"]["$ref"], "#/$defs/Node");

        let mut x = json!({"$ref": "other.yaml#/Pet"});
        assert!(resolve(&mut [&mut x], components, Version::V30).is_err());
        let mut missing = json!({"$ref": "#/components/schemas/Nope"});
        assert!(resolve(&mut [&mut missing], components, Version::V30).is_err());
    }
}
