//! Argument validation against a tool's compiled `inputSchema`, with every violation turned
//! into a clear, bilingual error naming the argument by its JSON path.

use jsonschema::error::{TypeKind, ValidationErrorKind};
use jsonschema::types::JsonType;
use serde_json::Value;
use toolgate_config::schema::LazyValidator;

use crate::envelope::ErrorEntry;

/// Most violations reported for one call; the rest are counted in one last entry, so a hostile
/// array of a million bad items cannot turn into a million-entry answer.
pub const MAX_REPORTED: usize = 50;

/// Validates `args`: a yes/no pass first (the validator memoises `$ref`s there, and it is what
/// nearly every call needs), and only for invalid arguments the violations: each of them, at most
/// [`MAX_REPORTED`] and then one entry saying how many more, when `all` (a small request); the
/// first alone otherwise, because the validator builds the whole list before it hands out one,
/// and the list for a large hostile object (a million bad items) costs more memory than the proxy
/// has.
pub fn validate(validator: &LazyValidator, args: &Value, all: bool) -> Vec<ErrorEntry> {
    match validator.get() {
        Ok(v) => validate_with(v, args, all),
        Err(e) => {
            // It compiled when the config was loaded; failing now is a bug, not the caller's.
            tracing::error!(
                error = e,
                "an inputSchema that compiled at load did not compile on first use"
            );
            vec![ErrorEntry::new(
                "schema_unavailable",
                "The tool's argument schema could not be prepared; the proxy logged the cause",
                "No se pudo preparar el esquema de argumentos de la herramienta; el proxy registró la causa",
                false,
            )]
        }
    }
}

/// [`validate`] with a compiled validator.
pub fn validate_with(validator: &jsonschema::Validator, args: &Value, all: bool) -> Vec<ErrorEntry> {
    if validator.is_valid(args) {
        return Vec::new();
    }
    let errors: Box<dyn Iterator<Item = jsonschema::ValidationError<'_>> + '_> = if all {
        Box::new(validator.iter_errors(args))
    } else {
        Box::new(validator.validate(args).err().into_iter())
    };
    let mut out = Vec::new();
    let mut more = 0usize;
    for err in errors {
        if out.len() >= MAX_REPORTED {
            more += 1;
            continue;
        }
        let base = field_of(args, err.instance_path().as_str());
        match err.kind() {
            ValidationErrorKind::Required { property } => {
                let name = property.as_str().map_or_else(|| property.to_string(), str::to_string);
                let field = join(&base, &name);
                out.push(entry(
                    &field,
                    format!("`{field}` is required"),
                    format!("Falta el campo obligatorio `{field}`"),
                ));
            }
            ValidationErrorKind::AdditionalProperties { unexpected } => {
                for name in unexpected {
                    let field = join(&base, name);
                    out.push(entry(
                        &field,
                        format!("`{field}` is not an accepted argument"),
                        format!("`{field}` no es un argumento aceptado"),
                    ));
                }
            }
            ValidationErrorKind::Type { kind } => {
                let expected: Vec<JsonType> = match kind {
                    TypeKind::Single(t) => vec![*t],
                    TypeKind::Multiple(set) => set.iter().collect(),
                };
                out.push(type_error(&base, &expected, err.instance()));
            }
            ValidationErrorKind::Enum { options } => {
                let list = options
                    .as_array()
                    .map(|o| o.iter().map(Value::to_string).collect::<Vec<_>>().join(", "))
                    .unwrap_or_else(|| options.to_string());
                let f = display(&base);
                out.push(entry(
                    &base,
                    format!("{f} must be one of: {list}"),
                    format!("{f} debe ser uno de: {list}"),
                ));
            }
            kind => {
                let f = display(&base);
                if let Some((en, es)) = bound_message(kind) {
                    out.push(entry(&base, format!("{f} {en}"), format!("{f} {es}")));
                    continue;
                }
                let detail = err.to_string();
                out.push(entry(
                    &base,
                    format!("{f} is invalid: {detail}"),
                    format!("{f} no es válido: {detail}"),
                ));
            }
        }
    }
    if more > 0 {
        out.truncate(MAX_REPORTED);
        out.push(entry(
            "",
            format!("and {more} more problems of the same kind; fix the ones above and call again"),
            format!("y {more} problemas más del mismo tipo; corrige los anteriores y vuelve a intentar"),
        ));
    }
    out
}

/// Bilingual wording for the common bound keywords.
fn bound_message(kind: &ValidationErrorKind) -> Option<(String, String)> {
    Some(match kind {
        ValidationErrorKind::MinLength { limit } => (
            format!("must be at least {limit} characters long"),
            format!("debe tener al menos {limit} caracteres"),
        ),
        ValidationErrorKind::MaxLength { limit } => (
            format!("must be at most {limit} characters long"),
            format!("debe tener como máximo {limit} caracteres"),
        ),
        ValidationErrorKind::Minimum { limit } => (
            format!("must be at least {limit}"),
            format!("debe ser al menos {limit}"),
        ),
        ValidationErrorKind::Maximum { limit } => (
            format!("must be at most {limit}"),
            format!("debe ser como máximo {limit}"),
        ),
        ValidationErrorKind::ExclusiveMinimum { limit } => (
            format!("must be greater than {limit}"),
            format!("debe ser mayor que {limit}"),
        ),
        ValidationErrorKind::ExclusiveMaximum { limit } => (
            format!("must be less than {limit}"),
            format!("debe ser menor que {limit}"),
        ),
        ValidationErrorKind::MinItems { limit } => (
            format!("must have at least {limit} items"),
            format!("debe tener al menos {limit} elementos"),
        ),
        ValidationErrorKind::MaxItems { limit } => (
            format!("must have at most {limit} items"),
            format!("debe tener como máximo {limit} elementos"),
        ),
        ValidationErrorKind::Pattern { pattern } => (
            format!("must match the pattern `{pattern}`"),
            format!("debe cumplir el patrón `{pattern}`"),
        ),
        ValidationErrorKind::Format { format } => (
            format!("must be a valid `{format}`"),
            format!("debe tener el formato `{format}`"),
        ),
        ValidationErrorKind::Constant { expected_value } => (
            format!("must be {expected_value}"),
            format!("debe ser {expected_value}"),
        ),
        ValidationErrorKind::UniqueItems => (
            "must not contain duplicate items".into(),
            "no debe tener elementos repetidos".into(),
        ),
        _ => return None,
    })
}

fn entry(field: &str, message: String, message_es: String) -> ErrorEntry {
    ErrorEntry::new("invalid_argument", message, message_es, false).with_field(field)
}

fn display(field: &str) -> String {
    if field.is_empty() {
        "`arguments`".to_string()
    } else {
        format!("`{field}`")
    }
}

fn join(base: &str, name: &str) -> String {
    if base.is_empty() {
        name.to_string()
    } else {
        format!("{base}.{name}")
    }
}

/// `/items/0/name` in `args` → `items[0].name` (array indexes in brackets).
pub fn field_of(args: &Value, pointer: &str) -> String {
    let mut out = String::new();
    let mut cur = Some(args);
    for raw in pointer.split('/').skip(1) {
        let token = raw.replace("~1", "/").replace("~0", "~");
        match cur {
            Some(Value::Array(a)) => {
                out.push('[');
                out.push_str(&token);
                out.push(']');
                cur = token.parse::<usize>().ok().and_then(|i| a.get(i));
            }
            other => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(&token);
                cur = other.and_then(|v| v.get(&token));
            }
        }
    }
    out
}

fn type_name(t: JsonType, es: bool) -> &'static str {
    match (t, es) {
        (JsonType::Array, false) => "an array",
        (JsonType::Boolean, false) => "a boolean",
        (JsonType::Integer, false) => "an integer",
        (JsonType::Null, false) => "null",
        (JsonType::Number, false) => "a number",
        (JsonType::Object, false) => "an object",
        (JsonType::String, false) => "a string",
        (JsonType::Array, true) => "un arreglo",
        (JsonType::Boolean, true) => "un booleano",
        (JsonType::Integer, true) => "un número entero",
        (JsonType::Null, true) => "nulo",
        (JsonType::Number, true) => "un número",
        (JsonType::Object, true) => "un objeto",
        (JsonType::String, true) => "un texto",
    }
}

fn actual_name(v: &Value, es: bool) -> &'static str {
    let t = match v {
        Value::Null => JsonType::Null,
        Value::Bool(_) => JsonType::Boolean,
        Value::Number(n) if n.is_i64() || n.is_u64() => JsonType::Integer,
        Value::Number(_) => JsonType::Number,
        Value::String(_) => JsonType::String,
        Value::Array(_) => JsonType::Array,
        Value::Object(_) => JsonType::Object,
    };
    type_name(t, es)
}

fn type_error(field: &str, expected: &[JsonType], got: &Value) -> ErrorEntry {
    let f = display(field);
    // The most common integration mistake: a structure serialized into a string.
    if let Value::String(s) = got {
        let trimmed = s.trim_start();
        let parsed = if trimmed.starts_with('{') || trimmed.starts_with('[') {
            serde_json::from_str::<Value>(s).ok()
        } else {
            None
        };
        let wanted = match parsed {
            Some(Value::Object(_)) if expected.contains(&JsonType::Object) => Some(("object", "objeto")),
            Some(Value::Array(_)) if expected.contains(&JsonType::Array) => Some(("array", "arreglo")),
            _ => None,
        };
        if let Some((en, es)) = wanted {
            return entry(
                field,
                format!("{f} must be a JSON {en}, but it is a string containing JSON: send the {en} itself, not its text"),
                format!("{f} debe ser un {es} JSON real, pero llegó como texto con JSON adentro: envía el {es}, no su texto"),
            );
        }
    }
    let join_names = |es: bool, or: &str| expected.iter().map(|t| type_name(*t, es)).collect::<Vec<_>>().join(or);
    entry(
        field,
        format!(
            "{f} must be {}, got {}",
            join_names(false, " or "),
            actual_name(got, false)
        ),
        format!(
            "{f} debe ser {}, se recibió {}",
            join_names(true, " o "),
            actual_name(got, true)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn errors(schema: Value, args: Value) -> Vec<ErrorEntry> {
        validate(&LazyValidator::new(&schema, &Default::default()), &args, true)
    }

    #[test]
    fn a_large_request_lists_its_first_violation_and_a_small_one_at_most_fifty_and_a_count() {
        let v = toolgate_config::schema::compile(
            &json!({"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string"}}}}),
            &Default::default(),
        )
        .unwrap();
        let args = json!({"items": vec![1; 500]});
        assert_eq!(validate_with(&v, &args, false).len(), 1);
        let all = validate_with(&v, &args, true);
        assert_eq!(all.len(), MAX_REPORTED + 1);
        assert!(
            all[MAX_REPORTED].message.contains("450 more"),
            "{:?}",
            all[MAX_REPORTED]
        );
        assert!(validate_with(&v, &json!({"items": ["a"]}), false).is_empty());
    }

    #[test]
    fn valid_arguments_have_no_errors() {
        assert!(errors(json!({"type": "object", "required": ["a"]}), json!({"a": 1})).is_empty());
    }

    #[test]
    fn every_violation_is_reported_with_its_path() {
        let schema = json!({
            "type": "object", "additionalProperties": false, "required": ["customerId", "items"],
            "properties": {
                "customerId": {"type": "string"},
                "priority": {"enum": ["low", "high"]},
                "items": {"type": "array", "items": {"type": "object", "required": ["value"], "properties": {"value": {"type": "string"}}}}
            }
        });
        let e = errors(
            schema,
            json!({"priority": "urgent", "items": [{"value": 3}, {}], "extra": true}),
        );
        let fields: Vec<_> = e.iter().map(|e| e.field.clone().unwrap()).collect();
        for f in ["customerId", "priority", "items[0].value", "items[1].value", "extra"] {
            assert!(fields.contains(&f.to_string()), "{f} missing in {fields:?}");
        }
        let req = e.iter().find(|e| e.field.as_deref() == Some("customerId")).unwrap();
        assert_eq!(req.message, "`customerId` is required");
        assert_eq!(req.code, "invalid_argument");
    }

    #[test]
    fn a_string_holding_json_where_an_object_is_expected_says_so() {
        let schema = json!({"type": "object", "properties": {"raw": {"type": "object"}, "list": {"type": "array"}}});
        let e = errors(
            schema,
            json!({"raw": "{\"monto\": \"$350.00\"}", "list": "[{\"value\": \"x\"}]"}),
        );
        assert_eq!(e.len(), 2);
        let raw = e.iter().find(|e| e.field.as_deref() == Some("raw")).unwrap();
        assert!(raw.message.contains("string containing JSON"), "{}", raw.message);
        assert!(raw.message_es.contains("texto con JSON"), "{}", raw.message_es);
        let list = e.iter().find(|e| e.field.as_deref() == Some("list")).unwrap();
        assert!(list.message.contains("JSON array"), "{}", list.message);
    }

    #[test]
    fn plain_type_errors_name_both_types() {
        let e = errors(
            json!({"type": "object", "properties": {"n": {"type": "integer"}}}),
            json!({"n": "five"}),
        );
        assert_eq!(e[0].message, "`n` must be an integer, got a string");
    }

    #[test]
    fn bounds_are_worded_in_both_languages() {
        let e = errors(
            json!({"type": "object", "properties": {"s": {"type": "string", "minLength": 3}}}),
            json!({"s": "x"}),
        );
        assert_eq!(e[0].message, "`s` must be at least 3 characters long");
        assert_eq!(e[0].message_es, "`s` debe tener al menos 3 caracteres");
    }

    #[test]
    fn field_paths_use_brackets_for_indexes() {
        let args = json!({"a": [{"b": {"c/d": 1}}]});
        assert_eq!(field_of(&args, "/a/0/b/c~1d"), "a[0].b.c/d");
        assert_eq!(field_of(&args, ""), "");
    }
}
