//! The tool result envelope `{ok, status, data, errors, nextQuestion, toolName, safety, durationMs}`
//! carried as the one text block (and as `structuredContent`) of every `tools/call` result.

use serde::Serialize;
#[cfg(test)]
use serde_json::Map;
use serde_json::{json, Value};
use toolgate_config::BusinessStatus;

/// One structured error inside an envelope.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ErrorEntry {
    /// Stable machine code, e.g. `invalid_argument`, `upstream_timeout`.
    pub code: String,
    /// English message.
    pub message: String,
    /// Spanish message.
    pub message_es: String,
    /// Argument (dotted path) or data field the error is about, when there is one.
    pub field: Option<String>,
    /// Whether the same call may succeed if retried later.
    pub retryable: bool,
}

impl ErrorEntry {
    /// An error without a field.
    pub fn new(code: &str, message: impl Into<String>, message_es: impl Into<String>, retryable: bool) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
            message_es: message_es.into(),
            field: None,
            retryable,
        }
    }

    /// The same error about `field`.
    pub fn with_field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }
}

/// The outcome of one call, before it is wrapped with the tool's name and duration.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Business status.
    pub status: BusinessStatus,
    /// Structured result (an object) or nothing.
    pub data: Option<Value>,
    /// Errors, empty on success.
    pub errors: Vec<ErrorEntry>,
    /// What the agent should ask the user next.
    pub next_question: Option<String>,
    /// HTTP status of the upstream response, when one arrived.
    pub upstream_status: Option<u16>,
}

impl Outcome {
    /// A failure with one error and no data.
    pub fn failed(error: ErrorEntry) -> Self {
        Self {
            status: BusinessStatus::Failed,
            data: None,
            errors: vec![error],
            next_question: None,
            upstream_status: None,
        }
    }

    /// The envelope as a JSON tree: the tests' oracle for [`Outcome::envelope_json`], which is
    /// what the proxy serves.
    #[cfg(test)]
    pub fn to_envelope(&self, tool: &str, safety: &str, duration_ms: u64) -> Value {
        let mut m = Map::with_capacity(8);
        m.insert("ok".into(), Value::Bool(self.status.is_ok() && self.errors.is_empty()));
        m.insert("status".into(), Value::String(self.status.as_str().into()));
        m.insert("data".into(), self.data.clone().unwrap_or(Value::Null));
        m.insert(
            "errors".into(),
            serde_json::to_value(&self.errors).unwrap_or_else(|_| json!([])),
        );
        m.insert(
            "nextQuestion".into(),
            self.next_question.clone().map_or(Value::Null, Value::String),
        );
        m.insert("toolName".into(), Value::String(tool.into()));
        m.insert("safety".into(), Value::String(safety.into()));
        m.insert("durationMs".into(), Value::from(duration_ms));
        Value::Object(m)
    }

    /// The envelope serialized directly (the hot path: no intermediate JSON tree), as compact
    /// JSON bytes: serde_json writes valid UTF-8, so nothing checks it again on the way out.
    pub fn envelope_json(&self, tool: &str, safety: &str, duration_ms: u64) -> Vec<u8> {
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Envelope<'a> {
            ok: bool,
            status: &'a str,
            data: &'a Option<Value>,
            errors: &'a [ErrorEntry],
            next_question: &'a Option<String>,
            tool_name: &'a str,
            safety: &'a str,
            duration_ms: u64,
        }
        // Sized for a typical envelope, so that it is not grown by doubling from 128 bytes.
        let mut out = Vec::with_capacity(1024);
        let written = serde_json::to_writer(
            &mut out,
            &Envelope {
                ok: !self.is_error(),
                status: self.status.as_str(),
                data: &self.data,
                errors: &self.errors,
                next_question: &self.next_question,
                tool_name: tool,
                safety,
                duration_ms,
            },
        );
        if written.is_err() {
            out.clear();
        }
        out
    }

    /// Whether the MCP result carries `isError: true`.
    pub fn is_error(&self) -> bool {
        !(self.status.is_ok() && self.errors.is_empty())
    }
}

/// The MCP `tools/call` result for an envelope: one text block and the same structured content.
/// The tests' oracle for [`call_result_json`], which is what the proxy serves.
#[cfg(test)]
pub fn call_result(envelope: Value, is_error: bool) -> Value {
    let text = envelope.to_string();
    json!({
        "content": [{"type": "text", "text": text}],
        "structuredContent": envelope,
        "isError": is_error,
    })
}

/// The MCP `tools/call` result for an already serialized envelope (compact JSON from
/// [`Outcome::envelope_json`]), as JSON bytes: one text block holding the envelope text,
/// escaped, and the same envelope, verbatim, as the structured content. An empty envelope (a failed serialization) gives an
/// empty result, which the caller answers as an internal error.
pub fn call_result_json(envelope_json: &[u8], is_error: bool) -> Vec<u8> {
    if envelope_json.is_empty() {
        return Vec::new();
    }
    // The text block escapes every quote: about 2.2 times the envelope in all, in one buffer.
    let mut out = Vec::with_capacity(envelope_json.len() * 23 / 10 + 96);
    out.extend_from_slice(br#"{"content":[{"type":"text","text":""#);
    push_escaped_compact(&mut out, envelope_json);
    out.extend_from_slice(br#""}],"structuredContent":"#);
    out.extend_from_slice(envelope_json);
    out.extend_from_slice(br#","isError":"#);
    out.extend_from_slice(if is_error { b"true" } else { b"false" });
    out.push(b'}');
    out
}

/// Appends compact JSON text as the contents of a JSON string. Compact JSON from serde_json
/// holds no control character (inside strings they are escaped, and there is no whitespace
/// between tokens), so `"` and `\` are the only bytes to escape: a vectorised scan for those
/// two rather than serde_json's table lookup per byte for any text, which was the largest
/// single cost of shaping a result (callgrind: 4 k of the 7.8 k instructions of a small one).
fn push_escaped_compact(out: &mut Vec<u8>, json: &[u8]) {
    debug_assert!(
        json.iter().all(|&b| b >= 0x20),
        "compact JSON has no control characters"
    );
    let mut rest = json;
    while let Some(i) = memchr::memchr2(b'"', b'\\', rest) {
        out.extend_from_slice(&rest[..i]);
        out.extend_from_slice(&[b'\\', rest[i]]);
        rest = &rest[i + 1..];
    }
    out.extend_from_slice(rest);
}

/// The envelope's `outputSchema` for a tool without one of its own, as JSON text before and after
/// the tool's name: it differs between such tools only in `toolName`'s `const`, so it is rendered
/// once per process (a 1,000-tool load spent a third of its time building and serializing the
/// same tree per tool, and kept a kilobyte of the same text per tool).
fn shared_output_schema() -> &'static (String, String) {
    static SHARED: std::sync::LazyLock<(String, String)> = std::sync::LazyLock::new(|| {
        // A name no tool can have (tool names are `A-Z a-z 0-9 _ - .`).
        const MARKER: &str = "\u{1}toolName\u{1}";
        let text = output_schema(MARKER, None).to_string();
        let (before, after) = text
            .split_once(&Value::from(MARKER).to_string())
            .expect("the envelope schema names the tool once");
        (before.to_string(), after.to_string())
    });
    &SHARED
}

/// A tool's `tools/list` entry as JSON text, kept in parts so that the envelope's output schema
/// is held once per process ([`shared_output_schema`]) rather than once per tool.
#[derive(Debug, Hash)]
pub struct Listing {
    /// The entry up to its `outputSchema` value, or through it when the tool has its own.
    before: Box<str>,
    /// The tool's name as a JSON string, when the shared envelope is the `outputSchema`.
    shared_for: Option<Box<str>>,
    /// The entry after its `outputSchema` value.
    after: Box<str>,
}

impl Listing {
    /// The entry of tool `name`, from the JSON text of its members before `outputSchema`
    /// (`{"name":…,…`, without a trailing comma) and after it (`,"title":…}`).
    pub fn new(name: &str, before: &str, data_schema: Option<&Value>, after: &str) -> Self {
        let mut head = format!("{before},\"outputSchema\":");
        let shared_for = match data_schema {
            None => Some(Value::from(name).to_string().into_boxed_str()),
            Some(_) => {
                head.push_str(&output_schema(name, data_schema).to_string());
                None
            }
        };
        Self {
            before: head.into_boxed_str(),
            shared_for,
            after: after.into(),
        }
    }

    /// Length of the text [`Listing::write`] appends.
    pub fn text_len(&self) -> usize {
        let (a, b) = shared_output_schema();
        let shared = self.shared_for.as_ref().map_or(0, |n| a.len() + n.len() + b.len());
        self.before.len() + shared + self.after.len()
    }

    /// Appends the entry's JSON text to `out`.
    pub fn write(&self, out: &mut String) {
        out.push_str(&self.before);
        if let Some(name) = &self.shared_for {
            let (a, b) = shared_output_schema();
            out.push_str(a);
            out.push_str(name);
            out.push_str(b);
        }
        out.push_str(&self.after);
    }
}

/// The published `outputSchema`: the envelope, with `data` held to the tool's own schema
/// whenever `status` is `success`.
pub fn output_schema(tool: &str, data_schema: Option<&Value>) -> Value {
    let error = json!({
        "type": "object",
        "properties": {
            "code": {"type": "string"},
            "message": {"type": "string"},
            "message_es": {"type": "string"},
            "field": {"type": ["string", "null"]},
            "retryable": {"type": "boolean"}
        },
        "required": ["code", "message", "message_es", "retryable"]
    });
    let mut schema = json!({
        "type": "object",
        "properties": {
            "ok": {"type": "boolean", "description": "true when the operation succeeded or was accepted (queued)"},
            "status": {"type": "string", "enum": ["success", "failed", "needs_more_info", "pending_confirmation", "queued"]},
            "data": {"type": ["object", "null"]},
            "errors": {"type": "array", "items": error},
            "nextQuestion": {"type": ["string", "null"]},
            "toolName": {"type": "string", "const": tool},
            "safety": {"type": "string", "enum": ["read_only", "mutation", "external_send", "destructive"]},
            "durationMs": {"type": "integer", "minimum": 0}
        },
        "required": ["ok", "status", "data", "errors", "nextQuestion", "toolName", "safety", "durationMs"]
    });
    if let Some(data) = data_schema {
        let mut data = data.clone();
        if let Some(obj) = data.as_object_mut() {
            obj.remove("$schema");
            // Hoist definitions so `#/$defs/...` references keep resolving from the new root.
            for key in ["$defs", "definitions"] {
                if let Some(defs) = obj.remove(key) {
                    schema[key] = defs;
                }
            }
        }
        schema["if"] = json!({"properties": {"status": {"const": "success"}}, "required": ["status"]});
        schema["then"] = json!({"properties": {"data": data}});
    }
    schema
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_writes_the_rendered_output_schema() {
        for (tool, data) in [
            ("get_customer", None),
            ("a.b-c_9", None),
            ("quote\"and\\slash", None),
            (
                "typed",
                Some(json!({"type": "object", "$defs": {"x": {"type": "string"}}})),
            ),
        ] {
            let before = format!(r#"{{"name":{}"#, Value::from(tool));
            let listing = Listing::new(tool, &before, data.as_ref(), r#","annotations":{}}"#);
            let mut out = String::new();
            listing.write(&mut out);
            assert_eq!(out.len(), listing.text_len(), "{tool}");
            let parsed: Value = serde_json::from_str(&out).unwrap();
            assert_eq!(
                parsed,
                json!({"name": tool, "outputSchema": output_schema(tool, data.as_ref()), "annotations": {}}),
                "{tool}"
            );
            assert_eq!(parsed["outputSchema"]["properties"]["toolName"]["const"], tool);
        }
    }

    #[test]
    fn envelope_has_every_key_even_when_empty() {
        let o = Outcome {
            status: BusinessStatus::Success,
            data: Some(json!({"id": 1})),
            errors: vec![],
            next_question: None,
            upstream_status: Some(200),
        };
        let e = o.to_envelope("t", "read_only", 7);
        assert_eq!(
            e,
            json!({"ok": true, "status": "success", "data": {"id": 1}, "errors": [], "nextQuestion": null,
                   "toolName": "t", "safety": "read_only", "durationMs": 7})
        );
        assert!(!o.is_error());
    }

    #[test]
    fn non_ok_statuses_are_errors() {
        for s in [
            BusinessStatus::Failed,
            BusinessStatus::NeedsMoreInfo,
            BusinessStatus::PendingConfirmation,
        ] {
            let o = Outcome {
                status: s,
                data: None,
                errors: vec![],
                next_question: None,
                upstream_status: None,
            };
            assert!(o.is_error(), "{s:?}");
            assert_eq!(o.to_envelope("t", "mutation", 0)["ok"], false);
        }
        let queued = Outcome {
            status: BusinessStatus::Queued,
            data: None,
            errors: vec![],
            next_question: None,
            upstream_status: None,
        };
        assert!(!queued.is_error());
    }

    #[test]
    fn result_has_one_text_block_equal_to_structured_content() {
        let env = json!({"ok": true});
        let r = call_result(env.clone(), false);
        let content = r["content"].as_array().unwrap();
        assert_eq!(content.len(), 1);
        assert_eq!(
            serde_json::from_str::<Value>(content[0]["text"].as_str().unwrap()).unwrap(),
            env
        );
        assert_eq!(r["structuredContent"], env);
    }

    #[test]
    fn the_fast_serialization_matches_the_tree() {
        let o = Outcome {
            status: BusinessStatus::NeedsMoreInfo,
            data: Some(json!({"b": 1, "a": "x\"y"})),
            errors: vec![ErrorEntry::new("c", "m", "m_es", true).with_field("f")],
            next_question: Some("¿Qué?".into()),
            upstream_status: Some(404),
        };
        let text = o.envelope_json("t", "read_only", 3);
        assert_eq!(
            serde_json::from_slice::<Value>(&text).unwrap(),
            o.to_envelope("t", "read_only", 3)
        );
        let fast: Value = serde_json::from_slice(&call_result_json(&text, o.is_error())).unwrap();
        assert_eq!(fast, call_result(o.to_envelope("t", "read_only", 3), true));
    }

    #[test]
    fn the_text_block_is_escaped_as_serde_json_escapes_it() {
        // Every kind of character a body can bring: quotes and backslashes (raw and in escapes),
        // control characters (escaped inside the envelope's strings), DEL, non-ASCII and the
        // line separators JavaScript once choked on.
        let data = json!({
            "q\"uote": "a\"b\\c\\\"d",
            "ctl": "\u{0}\u{1}\t\n\r\u{1f}",
            "del": "\u{7f}",
            "text": "¿Qué? 日本 \u{2028}\u{2029} 🦀",
            "nested": [{"x": "\\\\"}, null, 1.5e300, -0, true],
            "": "",
        });
        let o = Outcome {
            status: BusinessStatus::Success,
            data: Some(data),
            errors: vec![],
            next_question: Some("\"?\\".into()),
            upstream_status: Some(200),
        };
        let text = o.envelope_json("t", "read_only", 3);
        let raw = call_result_json(&text, false);
        let expected = call_result(o.to_envelope("t", "read_only", 3), false);
        // The same text, byte for byte, as serde_json's own escaping of the same envelope.
        let mut want = Vec::new();
        serde_json::to_writer(&mut want, std::str::from_utf8(&text).unwrap()).unwrap();
        let start = br#"{"content":[{"type":"text","text":"#.len();
        assert_eq!(&raw[start..start + want.len()], &want[..]);
        assert_eq!(serde_json::from_slice::<Value>(&raw).unwrap(), expected);
    }

    #[test]
    fn output_schema_holds_success_data_to_the_tool_schema() {
        let s = output_schema(
            "t",
            Some(&json!({"type": "object", "required": ["id"], "$defs": {"x": {}}})),
        );
        let v = toolgate_config::schema::compile(&s, &Default::default()).unwrap();
        let ok = |status: &str, data: Value| {
            let env = Outcome {
                status: BusinessStatus::Success,
                data: None,
                errors: vec![],
                next_question: None,
                upstream_status: None,
            }
            .to_envelope("t", "read_only", 1);
            let mut env = env;
            env["status"] = json!(status);
            env["data"] = data;
            v.is_valid(&env)
        };
        assert!(ok("success", json!({"id": 1})));
        assert!(!ok("success", json!({"name": 1})));
        assert!(ok("queued", json!({"jobId": "j"})));
        assert!(ok("failed", Value::Null));
        assert_eq!(s["$defs"], json!({"x": {}}));
    }
}
