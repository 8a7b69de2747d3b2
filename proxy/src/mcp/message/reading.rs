//! What the endpoint reads of a body, and what the same lookups in a whole `serde_json::Value`
//! parse give, written out as JSON text: the tests and the `jsonrpc_scan` fuzz target compare
//! the two byte for byte.

use serde_json::Value;

use super::{parse, Parsed, Text};
use crate::mcp::modern::{META_CAPABILITIES, META_CLIENT_INFO, META_VERSION};

/// What the endpoint reads of `body`, written out as a JSON value, or the parse error's message:
/// for the tests and the fuzzer, which compare it with [`tree_reading`], byte for byte.
#[doc(hidden)]
pub fn reading(body: &[u8]) -> Result<String, String> {
    let text = |t: &Option<Text>| t.as_ref().map(|t| t.as_str().map_or(Value::Bool(false), Value::from));
    let r = match parse(body).map_err(|e| e.to_string())? {
        Parsed::Scalar => Reading::Scalar,
        Parsed::Batch(items) => Reading::Batch(items),
        Parsed::Message(m) => Reading::Message(Box::new(MessageReading {
            jsonrpc_2: m.jsonrpc_2,
            id: m.id,
            method: text(&m.method),
            params: m.params,
            is_response: m.is_response,
            meta: m.meta.map(|meta| {
                [
                    ("version", text(&meta.version)),
                    ("capabilitiesAreAnObject", meta.capabilities.map(Value::Bool)),
                    ("clientName", text(&meta.client_info.name)),
                    ("clientVersion", text(&meta.client_info.version)),
                    ("traceparent", text(&meta.traceparent)),
                    ("tracestate", text(&meta.tracestate)),
                ]
            }),
        })),
    };
    Ok(r.written())
}

/// [`reading`] as the endpoint made it before it read messages itself: `body` parsed whole into
/// a `serde_json::Value`, the members looked up in it, `params._meta` taken out of `params`.
#[doc(hidden)]
pub fn tree_reading(body: &[u8]) -> Result<String, String> {
    let text = |v: Option<&Value>| v.map(|v| v.as_str().map_or(Value::Bool(false), Value::from));
    let r = match serde_json::from_slice::<Value>(body).map_err(|e| e.to_string())? {
        Value::Array(items) => Reading::Batch(items),
        Value::Object(m) => {
            let mut params = m.get("params").cloned();
            let meta = params
                .as_mut()
                .and_then(Value::as_object_mut)
                .and_then(|p| p.shift_remove("_meta"));
            let meta = meta.as_ref().and_then(Value::as_object).map(|meta| {
                let info = |k: &str| {
                    text(
                        meta.get(META_CLIENT_INFO)
                            .and_then(Value::as_object)
                            .and_then(|i| i.get(k)),
                    )
                };
                [
                    ("version", text(meta.get(META_VERSION))),
                    (
                        "capabilitiesAreAnObject",
                        meta.get(META_CAPABILITIES).map(|c| Value::Bool(c.is_object())),
                    ),
                    ("clientName", info("name")),
                    ("clientVersion", info("version")),
                    ("traceparent", text(meta.get("traceparent"))),
                    ("tracestate", text(meta.get("tracestate"))),
                ]
            });
            Reading::Message(Box::new(MessageReading {
                jsonrpc_2: m.get("jsonrpc").and_then(Value::as_str) == Some("2.0"),
                id: m.get("id").cloned(),
                method: text(m.get("method")),
                params,
                is_response: m.contains_key("result") || m.contains_key("error"),
                meta,
            }))
        }
        _ => Reading::Scalar,
    };
    Ok(r.written())
}

/// What [`reading`] and [`tree_reading`] write out: a scalar as `"scalar"`, a batch as
/// `{"batch": [...]}`, a message's members as an object. A member that should be a string is
/// `false` when it is not one; one that is absent is left out.
enum Reading {
    Scalar,
    Batch(Vec<Value>),
    Message(Box<MessageReading>),
}

struct MessageReading {
    jsonrpc_2: bool,
    id: Option<Value>,
    method: Option<Value>,
    params: Option<Value>,
    is_response: bool,
    meta: Option<[(&'static str, Option<Value>); 6]>,
}

impl Reading {
    fn written(self) -> String {
        let present = |members: Vec<(&str, Option<Value>)>| {
            Value::Object(
                members
                    .into_iter()
                    .filter_map(|(k, v)| Some((k.to_string(), v?)))
                    .collect(),
            )
        };
        let v = match self {
            Reading::Scalar => Value::from("scalar"),
            Reading::Batch(items) => present(vec![("batch", Some(Value::Array(items)))]),
            Reading::Message(m) => present(vec![
                ("jsonrpc2", Some(Value::Bool(m.jsonrpc_2))),
                ("id", m.id),
                ("method", m.method),
                ("params", m.params),
                ("isResponse", Some(Value::Bool(m.is_response))),
                ("meta", m.meta.map(|meta| present(meta.into()))),
            ]),
        };
        v.to_string()
    }
}
